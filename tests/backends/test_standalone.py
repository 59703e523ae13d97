"""Standalone communicators (``Backend.create_standalone``): gloo's, built by the members of a
group in threads of one process over a real ProcessGroupGloo, with and without its mismatch check,
and the contract's default refusal."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as torch_dist

from commlayer.backends.gloo import GlooBackend
from commlayer.backends.nccl import NcclBackend
from commlayer.contract.backend import Backend, StandaloneOptions
from commlayer.contract.registry import register_backend, unregister_backend
from commlayer.core.errors import CollectiveMismatchError, UnsupportedError
from commlayer.core.types import Availability, Capabilities, GroupSpec, ReduceOp
from commlayer.ft import FaultToleranceOptions, FaultTolerantDataParallel, Manager

TIMEOUT = timedelta(seconds=20)


def _on_members(size: int, name: str, body: Callable[[Backend], Any], checks: bool) -> list[Any]:
    """Each of ``size`` members builds its standalone gloo communicator and runs ``body`` on it."""
    store = torch_dist.HashStore()

    def member(rank: int) -> Any:
        spec = GroupSpec(name, tuple(range(size)), rank, store, TIMEOUT)
        communicator = GlooBackend.create_standalone(spec, StandaloneOptions(mismatch_checks=checks))
        try:
            return body(communicator)
        except Exception as error:  # noqa: BLE001 - returned, so every member's outcome is seen
            return error

    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(member, range(size)))


def test_gloo_standalone_reduces_exactly_again_and_again_in_one_process() -> None:
    def body(communicator: Backend) -> list[float]:
        tensor = torch.arange(4, dtype=torch.float64) + 10 * communicator.rank
        communicator.all_reduce(tensor, ReduceOp.SUM, async_op=True).wait()
        root = torch.full((2,), float(communicator.rank))
        communicator.broadcast(root, 2, async_op=True).wait()
        return [*tensor.tolist(), *root.tolist()]

    for generation, checks in enumerate((True, False)):
        results = _on_members(3, f"g{generation}", body, checks)
        assert results == [[30.0, 33.0, 36.0, 39.0, 2.0, 2.0]] * 3, results


def test_gloo_standalone_checks_signatures_unless_told_not_to() -> None:
    def mismatched(communicator: Backend) -> Any:
        dtype = torch.float32 if communicator.rank == 0 else torch.int32
        return communicator.all_reduce(torch.ones(4, dtype=dtype), ReduceOp.SUM, async_op=False)

    checked = _on_members(2, "checked", mismatched, checks=True)
    assert all(isinstance(outcome, CollectiveMismatchError) for outcome in checked), checked
    assert "float32" in str(checked[1]) and "int32" in str(checked[1])

    # Unchecked, gloo runs the mismatched call (same element size: it completes, its data is
    # meaningless): the check, and nothing else, is off.
    unchecked = _on_members(2, "unchecked", mismatched, checks=False)
    assert not any(isinstance(outcome, Exception) for outcome in unchecked), unchecked


class _WorldOnly(Backend):
    """A backend that implements only the mandatory contract (never instantiated)."""

    name = "world-only"
    capabilities = Capabilities(devices=frozenset({"cpu"}))
    create_world = new_group = all_reduce = None  # type: ignore[assignment]
    all_gather_into_tensor = broadcast = barrier = send = recv = None  # type: ignore[assignment]

    @classmethod
    def is_available(cls) -> Availability:
        return Availability.yes()


def test_the_default_refuses_and_ft_refuses_such_a_backend_before_any_quorum() -> None:
    spec = GroupSpec("solo", (0,), 0, torch_dist.HashStore(), TIMEOUT)
    assert not _WorldOnly.builds_standalone and GlooBackend.builds_standalone
    assert NcclBackend.builds_standalone  # fault-tolerant jobs on GPUs (needs CUDA to build)
    with pytest.raises(UnsupportedError, match="backend 'world-only' cannot build standalone communicators"):
        _WorldOnly.create_standalone(spec, StandaloneOptions())
    register_backend("world-only", _WorldOnly)
    try:
        options = FaultToleranceOptions(replicas=1, backend="world-only")
        with pytest.raises(UnsupportedError, match="expected a backend that builds standalone"):
            Manager(options, store=torch_dist.HashStore(), member=0, sharded=False)
    finally:
        unregister_backend("world-only")


def test_an_abort_leaves_a_standalone_gloo_communicator_at_once() -> None:
    # gloo's ops wait in their Work, which the caller abandons: the contract's default does nothing.
    assert _on_members(2, "aborted", lambda comm: comm.abort(), checks=False) == [None, None]


def test_ft_data_parallel_wants_one_dtype_on_a_device_of_its_backend() -> None:
    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double())
    elsewhere = torch.nn.Linear(2, 2, device="meta")
    manager = Manager(
        FaultToleranceOptions(replicas=1), store=torch_dist.HashStore(), member=0, sharded=False
    )
    try:
        with pytest.raises(
            ValueError, match=r"one dtype on one device, received dtypes.*float64.*\(member 0\)"
        ):
            FaultTolerantDataParallel(mixed, lambda params: torch.optim.SGD(params, lr=0.1), manager, stage=0)
        with pytest.raises(
            ValueError, match=r"a device of backend 'gloo' \(cpu\), received meta \(member 0\)"
        ):
            FaultTolerantDataParallel(
                elsewhere, lambda params: torch.optim.SGD(params, lr=0.1), manager, stage=0
            )
    finally:
        manager.finish()
