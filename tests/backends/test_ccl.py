"""Real multi-rank runs of the ccl backend (oneCCL through commlayer's own binding).

The compatibility suite every backend must pass, ccl-specific checks, and the failure modes
(bad KVS address, a peer that never joins, a peer that skips an op) that must end in a clear
error within the group timeout instead of a hang.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.contract.registry import list_backends
from commlayer.testing import run_world
from tests._examples import torchrun_allreduce_example

REPO = Path(__file__).resolve().parents[2]


def _ccl_unavailable_reason() -> str | None:
    for info in list_backends():
        if info.name == "ccl":
            return None if info.availability else info.availability.reason
    return "no 'ccl' backend is registered"


_REASON = _ccl_unavailable_reason()
pytestmark = [
    pytest.mark.multirank,
    pytest.mark.ccl,
    pytest.mark.skipif(_REASON is not None, reason=f"ccl unavailable: {_REASON}"),
]


# World 4 also runs every check on a subgroup of 3 ranks, so odd sizes are covered there.
@pytest.mark.parametrize("world_size", [2, 4])
def test_compatibility_suite_on_ccl(world_size: int) -> None:
    run_world("commlayer.testing.conformance:main", world_size, backend="ccl", timeout=300)


@pytest.mark.parametrize("world_size", [2, 4])
def test_ccl_specific_checks(world_size: int) -> None:
    run_world("tests.backends.ccl_ranks:main", world_size, backend="ccl", timeout=240)


@pytest.mark.parametrize("kind", ["unreachable", "garbage", "truncated"])
def test_bad_kvs_address_is_a_clear_error(kind: str) -> None:
    run_world("tests.backends.ccl_failures_ranks:bad_kvs_address", 1, backend=None, timeout=60, args=[kind])


def test_world_peer_that_never_joins_is_a_clear_error() -> None:
    run_world("tests.backends.ccl_failures_ranks:peer_never_joins_world", 1, backend=None, timeout=60)


def test_subgroup_peer_that_never_joins_is_a_clear_error() -> None:
    run_world("tests.backends.ccl_failures_ranks:peer_never_joins_subgroup", 2, backend=None, timeout=90)


def test_peer_that_skips_an_op_times_out_and_teardown_survives() -> None:
    run_world("tests.backends.ccl_failures_ranks:peer_skips_an_op", 2, backend=None, timeout=90)


def test_torch_script_runs_on_ccl_under_torchrun() -> None:
    """examples/allreduce.py (a torch.distributed script, one changed import) with COMMLAYER_BACKEND=ccl."""
    finished = torchrun_allreduce_example(backend="ccl")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert finished.stdout.count("on ccl: all_reduce") == 2, finished.stdout
