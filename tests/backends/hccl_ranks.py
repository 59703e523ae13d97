"""Rank bodies for the hccl backend, run through the torch_npu TEST DOUBLE (no NPU was available).

tests/backends/test_hccl.py runs them with ``tests/backends/doubles/fake_torch_npu_double`` on PYTHONPATH, so the
``import torch_npu`` below loads the double: "hccl" becomes a torch backend that is gloo
underneath, registered for CPU tensors, and ``torch.npu`` reports one NPU.
"""

from __future__ import annotations

import os

import torch
import torch_npu  # the TEST DOUBLE (see the module docstring)

from commlayer import dist
from commlayer.backends.hccl import HcclBackend
from commlayer.contract.selection import detect_accelerator
from commlayer.core.errors import BackendUnavailableError
from commlayer.core.types import ReduceOp
from commlayer.testing import conformance

assert getattr(torch_npu, "IS_TEST_DOUBLE", False), "expected the torch_npu test double on PYTHONPATH"


def compat_suite() -> None:
    """The compatibility suite on backend="hccl": facade -> HcclBackend -> torch "hccl" group."""
    backend = dist.group.WORLD.primary_backend
    assert isinstance(backend, HcclBackend), backend
    assert backend.torch_group is not None and dist.get_backend() == "hccl"
    conformance.main()


def picked_automatically() -> None:
    """No backend named anywhere: an NPU reported by torch_npu selects hccl for npu tensors."""
    os.environ.pop("COMMLAYER_BACKEND", None)
    assert detect_accelerator() == "npu"
    dist.init_process_group()
    try:
        assert dist.get_backend() == "cpu:gloo,npu:hccl", dist.get_backend()
        hccl = dist.group.WORLD.backend_for("npu")
        assert isinstance(hccl, HcclBackend), hccl
        # The double's tensors are CPU tensors; drive the hccl communicator directly.
        rank, world = dist.get_rank(), dist.get_world_size()
        tensor = torch.arange(3, dtype=torch.float32) + 10 * rank
        hccl.all_reduce(tensor, ReduceOp.SUM).wait()
        expected = torch.arange(3, dtype=torch.float32) * world + 10 * sum(range(world))
        assert torch.equal(tensor, expected), tensor
    finally:
        dist.destroy_process_group()


def unavailable_without_an_npu() -> None:
    """torch_npu present but reporting no NPU: hccl is unavailable, with the reason, before any rendezvous."""
    assert os.environ.get("FAKE_TORCH_NPU_DOUBLE_DEVICES") == "0"
    availability = HcclBackend.is_available()
    assert not availability and "reports no NPU" in availability.reason, availability
    assert detect_accelerator() == "cpu"
    try:
        dist.init_process_group("hccl")
    except BackendUnavailableError as error:
        assert "hccl" in str(error) and "reports no NPU" in str(error), str(error)
        return
    raise AssertionError("init_process_group('hccl') should fail without an NPU")
