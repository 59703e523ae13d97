"""Which torch ProcessGroup torch's ``init_process_group("commlayer")`` gets, by commlayer's selection.

The selection is a pure function of the environment and the accelerator; the bridge's choice is a
pure function of the selection; and a 2-rank world whose selection is the CUDA host's default
(``cpu:gloo,cuda:peermem``, handed in through ``$COMMLAYER_BACKEND``) builds a working group on
this CPU host: the bridge, over commlayer's gloo for the CPU half.
"""

from __future__ import annotations

import pytest

from commlayer.contract.selection import DEFAULT_BY_ACCELERATOR, device_present, resolve_backend_spec
from commlayer.facade.torch_bridge.groups import serves_itself
from commlayer.testing import run_world


def test_a_cuda_host_selects_peermem_for_cuda_and_gloo_for_cpu() -> None:
    assert resolve_backend_spec(None, {}, "cuda") == "cpu:gloo,cuda:peermem"
    assert resolve_backend_spec(None, {"COMMLAYER_BACKEND": "mpi"}, "cuda") == "mpi"


@pytest.mark.parametrize(
    ("spec", "torch_gloo"),
    [
        ("gloo", True),
        ("cpu:gloo", True),
        ("shm", False),
        ("cpu:gloo,cuda:peermem", False),
        ("cpu:gloo,cuda:nccl", False),
        ("cpu:shm,cuda:peermem", False),
        ("mpi", False),
    ],
)
def test_the_bridge_hands_torch_its_gloo_only_for_gloo_alone(spec: str, torch_gloo: bool) -> None:
    assert serves_itself(spec) is torch_gloo


def test_devices_this_host_lacks_are_absent() -> None:
    assert device_present("cpu")
    assert not device_present("cuda")  # the CI machine has no GPU
    assert device_present("no_such_device_type")  # torch cannot probe it: the backend decides


@pytest.mark.multirank
def test_init_process_group_commlayer_with_the_cuda_default_builds_a_working_group() -> None:
    run_world(
        "tests.facade.torch_bridge_selection_ranks:main",
        2,
        backend=None,
        timeout=240,
        env={"COMMLAYER_BACKEND": DEFAULT_BY_ACCELERATOR["cuda"]},
    )
