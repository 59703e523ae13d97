"""Rank bodies for the ccl failure modes: each must end in a clear error, never a hang.

Run by tests/backends/test_ccl.py through run_world (each in a fresh process, since oneCCL reads its
settings once per process). The single-rank bodies play one member of a two-rank group whose
other member is only simulated through the store, so the failure is exactly the one wanted.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.backends.ccl import CclBackend
from commlayer.backends.ccl.bootstrap import GroupKeys
from commlayer.core.errors import CommError, CommTimeoutError
from commlayer.core.types import GroupSpec

TIMEOUT = timedelta(seconds=3)

BAD_ADDRESSES = {
    # Well formed, but nothing listens on port 1: oneCCL's connection attempts run out.
    "unreachable": b"127.0.0.1_1".ljust(256, b"\0"),
    "garbage": b"x" * 256,
    "truncated": b"127.0.0.1_1",
}


def bad_kvs_address(kind: str) -> None:
    """Global rank 1 of a 2-rank world finds a bad KVS address where rank 0's should be."""
    store = torch_dist.HashStore()
    keys = GroupKeys("world/1")  # the first incarnation of "world" in this fresh process
    store.set(keys.joined(0), b"1")
    store.set(keys.address, BAD_ADDRESSES[kind])
    spec = GroupSpec("world", (0, 1), 1, store, TIMEOUT)
    error = _expect(CommError, lambda: CclBackend.create_world(spec))
    assert "KVS" in str(error) and "(rank 1)" in str(error) and "world" in str(error), str(error)
    if kind != "unreachable":
        assert "expected a oneCCL KVS address" in str(error), str(error)


def peer_never_joins_world() -> None:
    """Rank 0 of a 2-rank world whose rank 1 never starts."""
    spec = GroupSpec("world", (0, 1), 0, torch_dist.HashStore(), TIMEOUT)
    error = _expect(CommTimeoutError, lambda: CclBackend.create_world(spec))
    assert "group ranks [1] (global ranks [1]) did not join" in str(error), str(error)
    assert "(rank 0)" in str(error), str(error)


def peer_never_joins_subgroup() -> None:
    """World of 2 on ccl; global rank 0 builds new_group([0, 1]) but rank 1 never does."""
    dist.init_process_group("ccl", timeout=timedelta(seconds=60))  # WORLD is not under test
    store = dist.group.WORLD.primary_backend.spec.store
    if dist.get_rank() == 0:
        error = _expect(CommTimeoutError, lambda: dist.new_group([0, 1], timeout=TIMEOUT))
        assert "did not join" in str(error) and "[1]" in str(error), str(error)
        store.set("test/rank0_gave_up", b"1")
    else:
        store.wait(["test/rank0_gave_up"], timedelta(seconds=60))
    # WORLD's communicator is unharmed: the failure happened in the store, before oneCCL.
    tensor = torch.tensor([1.0 + dist.get_rank()])
    dist.all_reduce(tensor)
    assert tensor.item() == 3.0, tensor
    dist.destroy_process_group()


def peer_skips_an_op() -> None:
    """World of 2; rank 1 never sends or calls all_reduce: rank 0's waits end in clear errors."""
    dist.init_process_group("ccl", timeout=TIMEOUT)
    store = dist.group.WORLD.primary_backend.spec.store
    if dist.get_rank() == 0:
        pending = dist.irecv(torch.zeros(3), src=1)
        error = _expect(CommTimeoutError, lambda: pending.wait(timedelta(seconds=0.5)))
        assert "still pending" in str(error), str(error)  # a short wait of the caller's choosing
        error = _expect(CommTimeoutError, lambda: dist.all_reduce(torch.ones(4)))
        assert "group's timeout" in str(error) and "all_reduce" in str(error), str(error)
        error = _expect(CommError, lambda: dist.broadcast(torch.ones(2), src=0))
        assert "cannot be used after an op timed out" in str(error), str(error)
        store.set("test/rank0_saw_timeouts", b"1")
    else:
        store.wait(["test/rank0_saw_timeouts"], timedelta(seconds=60))
    # Both ranks now exit: teardown must not crash or hang with ops still pending.
    dist.destroy_process_group()


def _expect(error_type: type[BaseException], action) -> BaseException:
    start = time.monotonic()
    try:
        action()
    except error_type as error:
        print(f"got {type(error).__name__} after {time.monotonic() - start:.1f} s: {error}", flush=True)
        return error
    raise AssertionError(f"expected {error_type.__name__}, but the call returned")
