"""Real multi-rank runs: the compatibility suite on gloo at 2, 3 and 4 ranks, and the examples.

Other backends run the same suite from their own test modules (tests/backends/test_<backend>.py),
so every backend is held to one definition of correct.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.core.ports import free_port
from commlayer.testing import run_world
from tests._examples import torchrun_allreduce_example

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.multirank


# World 4 also runs every check on a subgroup of 3 ranks, so odd sizes are covered there.
@pytest.mark.parametrize("world_size", [2, 4])
def test_compatibility_suite_on_gloo(world_size: int) -> None:
    run_world("commlayer.testing.conformance:main", world_size, backend="gloo", timeout=240)


def test_every_init_method(tmp_path: Path) -> None:
    ports = (str(free_port()), str(free_port()))
    run_world(
        "tests.facade.compat_init_methods_ranks:main",
        2,
        backend=None,
        timeout=120,
        args=(*ports, str(tmp_path / "rendezvous")),
    )


def test_torch_script_runs_unchanged_under_torchrun() -> None:
    """examples/allreduce.py is a torch.distributed script with one changed import."""
    finished = torchrun_allreduce_example(backend="")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert finished.stdout.count("(correct)") == 2, finished.stdout


def test_ddp_trains_on_a_commlayer_group() -> None:
    run_world("tests.facade.compat_examples_ranks:ddp", 2, backend=None, timeout=180)
