"""Rank bodies of the per-call timeout tests (tests/facade/test_call_timeouts.py)."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch

from commlayer import dist
from commlayer.core.errors import CommTimeoutError, InvalidArgumentError, InvalidTypeError
from commlayer.facade.calls.timeouts import CallTimeoutWork
from commlayer.facade.groups.group import current_world

TIMEOUT_S = 1.0
LIMIT_S = 1.5 * TIMEOUT_S


def peer_never_comes(backend: str) -> None:
    """Calls with ``timeout=`` complete as usual; one whose peer never comes raises in time."""
    dist.init_process_group(backend, timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    stalled, unsent = dist.new_group([0, 1]), dist.new_group([0, 1])
    for group in (stalled, unsent):  # connected by a first op (gloo connects lazily)
        dist.barrier(group=group)
    _completing_calls(rank)
    _bad_timeouts_are_refused_before_communicating(rank)
    store = current_world("test").store
    if rank == 0:
        _expect_timeout(
            "all_reduce", stalled, lambda: dist.all_reduce(torch.ones(4), group=stalled, timeout=TIMEOUT_S)
        )
        pending = dist.irecv(torch.zeros(2), src=1, group=unsent, timeout=timedelta(seconds=TIMEOUT_S))
        assert isinstance(pending, CallTimeoutWork), pending
        _expect_timeout("irecv", unsent, pending.wait)
        store.set("test/rank0_timed_out", b"1")
    else:
        store.wait(["test/rank0_timed_out"], timedelta(seconds=60))
    if backend != "mpi":  # MPI cannot cancel the abandoned ops: the job ends at exit instead
        dist.destroy_process_group()


def _completing_calls(rank: int) -> None:
    tensor = torch.tensor([1.0 + rank, 10.0 * (rank + 1)])
    dist.all_reduce(tensor, timeout=30)
    assert tensor.tolist() == [3.0, 30.0], tensor
    work = dist.broadcast(
        tensor := torch.tensor([float(rank)]), src=1, async_op=True, timeout=timedelta(seconds=30)
    )
    assert isinstance(work, CallTimeoutWork) and work.wait() and tensor.item() == 1.0, tensor
    outputs = [torch.zeros(2) for _ in range(2)]
    dist.all_gather(outputs, torch.tensor([rank, rank + 0.5]), timeout=30)
    assert [output.tolist() for output in outputs] == [[0.0, 0.5], [1.0, 1.5]], outputs
    if rank == 0:
        dist.send(torch.tensor([7.0, 8.0]), dst=1, timeout=30)
    else:
        received = torch.zeros(2)
        assert dist.recv(received, src=0, timeout=30) == 0 and received.tolist() == [7.0, 8.0], received
    dist.barrier(timeout=30)


def _bad_timeouts_are_refused_before_communicating(rank: int) -> None:
    for bad, kind in (
        ("1s", InvalidTypeError),
        (0, InvalidArgumentError),
        (timedelta(seconds=-1), InvalidArgumentError),
    ):
        try:
            dist.all_reduce(torch.ones(1), timeout=bad)
        except kind as error:
            assert "all_reduce: argument 'timeout'" in str(error) and f"(rank {rank})" in str(error), error
        else:
            raise AssertionError(f"timeout={bad!r} was accepted")


def _expect_timeout(op: str, group: object, call) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    try:
        call()
    except CommTimeoutError as error:
        elapsed = time.monotonic() - started
        message = str(error)
        assert f"{op}: did not complete within its timeout of {TIMEOUT_S:g} s" in message, message
        assert "(rank 0)" in message and f"group '{group.name}'" in message, message  # type: ignore[attr-defined]
        assert elapsed < LIMIT_S, f"{op}: CommTimeoutError after {elapsed:.2f} s, over {LIMIT_S} s"
        print(
            f"{op}: CommTimeoutError after {elapsed:.2f} s (timeout {TIMEOUT_S} s) on {os.environ.get('COMMLAYER_BACKEND', '')}",
            flush=True,
        )
        return
    raise AssertionError(f"{op}: the call returned though its peer never came")
