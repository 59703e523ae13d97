"""The hccl backend. No Ascend NPU was available: the multi-rank tests run the whole dispatch path
(facade -> registry -> HcclBackend -> torch's "hccl" process group) through a TEST DOUBLE of
torch_npu, tests/backends/doubles/fake_torch_npu_double, whose "hccl" is gloo underneath.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from commlayer.backends.hccl import INSTALL_HINT, HcclBackend
from commlayer.contract.registry import list_backends
from commlayer.testing import run_world

DOUBLE = Path(__file__).resolve().parent / "doubles" / "fake_torch_npu_double"
REPO = Path(__file__).resolve().parents[2]


def _double_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(DOUBLE), str(REPO), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "COMMLAYER_BACKEND": "", **extra}


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="a torch_npu is installed here")
def test_without_torch_npu_hccl_is_unavailable_with_reason_and_hint() -> None:
    availability = HcclBackend.is_available()
    assert not availability
    assert "torch_npu is not installed" in availability.reason
    assert availability.install_hint == INSTALL_HINT and "pip install torch-npu" in INSTALL_HINT
    (info,) = [info for info in list_backends() if info.name == "hccl"]
    assert info.origin == "commlayer.backends.hccl:HcclBackend" and not info.availability


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [2, 3])
def test_compatibility_suite_through_the_torch_npu_double(world_size: int) -> None:
    run_world(
        "tests.backends.hccl_ranks:compat_suite", world_size, backend="hccl", timeout=240, env=_double_env()
    )


@pytest.mark.multirank
def test_hccl_is_picked_automatically_when_torch_npu_reports_an_npu() -> None:
    run_world(
        "tests.backends.hccl_ranks:picked_automatically", 2, backend=None, timeout=120, env=_double_env()
    )


@pytest.mark.multirank
def test_hccl_is_unavailable_when_torch_npu_reports_no_npu() -> None:
    env = _double_env(FAKE_TORCH_NPU_DOUBLE_DEVICES="0")
    run_world("tests.backends.hccl_ranks:unavailable_without_an_npu", 1, backend=None, timeout=60, env=env)
