"""The ``shm`` backend's native window: every rank's window is a shared-memory segment every peer maps.

Segment layout (one per rank, in /dev/shm): one 64-byte line per source rank holding the count of
signals that rank sent here (each line has a single writer, its source, so no two ranks ever
write one line), then the window's elements. ``Window.tensor`` is a view of the elements,
initialised from the registered tensor. A put is one copy into the target's mapping, a get one
out of it (``_C.copy``, whose large copies bypass the cache), so both complete remotely when they
return; ``map(peer)`` is the peer's view. Blocking puts and gets of plainly valid arguments run
whole in C (``fast_put``/``fast_get``, csrc/shm/window_copies.hpp).

Ordering: a signal is a plain 8-byte store of the incremented count after the put's copy, and a
waiter loads the count before reading the data. That is release/acquire on x86-64 (TSO: stores
become visible in program order, loads are not reordered with older loads; ``_C.copy`` ends its
non-temporal stores with ``sfence``; an aligned 8-byte store is atomic), and CPython
calls are compiler barriers. Other architectures would need fences, so
:meth:`~backends.shm.backend.ShmBackend.window` gives them the two-sided window instead.
"""

from __future__ import annotations

import mmap
import os
import secrets
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from commlayer.backends.shm.native import load_extension
from commlayer.contract.windows import BackendWindow, PollWork, WindowSpec, signal_timeout
from commlayer.core.shm_files import create_mapped
from commlayer.core.tensor_reader import tensor_meta_reader
from commlayer.core.work import CompletedWork, Work

__all__ = ["ShmWindow"]

_LINE = 64  # bytes per signal counter: one cache line, so counters of different writers never share one
_COUNTER_STRIDE = _LINE // 8  # in uint64 elements
_COMPLETED = CompletedWork()  # stateless, so one instance serves every synchronous op


class ShmWindow(BackendWindow):
    """A window whose memory every member maps; see the module docstring."""

    mappable = True

    def __init__(
        self, tensor: torch.Tensor, spec: WindowSpec, store: object, barrier: Callable[[], None]
    ) -> None:
        self._itemsize = tensor.element_size()
        self._header = _LINE * spec.size
        mappings = _map_segments(spec, store, self._header + max(1, tensor.nbytes), tensor)
        self._mappings = mappings  # the mmap objects: the views below keep them alive too
        self._bases = [torch.frombuffer(m, dtype=torch.uint8) for m in mappings]
        self._views = [
            base[self._header : self._header + size * self._itemsize].view(tensor.dtype)
            for base, size in zip(self._bases, spec.sizes)
        ]
        self._addresses = [base.data_ptr() + self._header for base in self._bases]
        self._counters = [
            np.frombuffer(m, dtype=np.uint64, count=spec.size * _COUNTER_STRIDE) for m in mappings
        ]
        self._incoming = self._counters[spec.rank]
        self._copy = load_extension().copy
        self.fast_put, self.fast_get = _fast_copies(tensor, spec, self._addresses)
        self._consumed = [0] * spec.size
        super().__init__(self._views[spec.rank].view(tensor.shape), spec)
        self._barrier = barrier

    def put(self, src: torch.Tensor, dst: int, offset: int, *, async_op: bool) -> Work:
        self._copy(self._addresses[dst] + offset * self._itemsize, src.data_ptr(), src.nbytes)
        return _COMPLETED

    def get(self, out: torch.Tensor, src: int, offset: int, *, async_op: bool) -> Work:
        self._copy(out.data_ptr(), self._addresses[src] + offset * self._itemsize, out.nbytes)
        return _COMPLETED

    def signal(self, dst: int, *, async_op: bool) -> Work:
        # The single writer of this line: a read-modify-write needs no atomic instruction.
        self._counters[dst][self.spec.rank * _COUNTER_STRIDE] += 1
        return _COMPLETED

    def wait_signal(self, src: int, timeout_s: float, *, async_op: bool) -> Work:
        self._consumed[src] += 1
        wanted, slot, counters = self._consumed[src], src * _COUNTER_STRIDE, self._incoming
        if counters[slot] >= wanted:
            return _COMPLETED
        work = PollWork(lambda: counters[slot] >= wanted, timeout_s, lambda: self._expired(src, timeout_s))
        if not async_op:
            work.wait()
        return work

    def _expired(self, src: int, timeout_s: float) -> Exception:
        self._consumed[src] -= 1  # a wait that timed out consumed no signal
        return signal_timeout(self.spec, src, timeout_s)

    def fence(self, *, async_op: bool) -> Work:
        # Puts and gets are complete when they return; the barrier orders them for every reader.
        self._barrier()
        return _COMPLETED

    def map(self, peer: int) -> torch.Tensor:
        return self._views[peer]

    def close(self) -> None:
        self.fast_put = self.fast_get = None  # they hold the peers' addresses
        self._bases = self._views = []
        self._addresses, self._counters = [], []


def _map_segments(spec: WindowSpec, store: object, nbytes: int, initial: torch.Tensor) -> list[mmap.mmap]:
    """Create this rank's segment holding ``initial``, map every member's, then unlink this rank's
    name (collective). The contents are written before any peer can learn the name.

    Once every member has mapped every segment the names go, so the memory lives only as long
    as the mappings and a killed job leaves nothing in /dev/shm.
    """
    prefix = f"commlayer/window/{spec.key}"
    path = f"/dev/shm/commlayer-window-{os.getpid()}-{secrets.token_hex(8)}"
    own = create_mapped(path, nbytes)
    header = _LINE * spec.size
    torch.frombuffer(own, dtype=torch.uint8)[header : header + initial.nbytes].view(initial.dtype).copy_(
        initial.reshape(-1)
    )
    store.set(f"{prefix}/path/{spec.rank}", path)  # type: ignore[attr-defined]
    mappings = [
        own if rank == spec.rank else _open(store.get(f"{prefix}/path/{rank}").decode())  # type: ignore[attr-defined]
        for rank in range(spec.size)
    ]
    store.set(f"{prefix}/mapped/{spec.rank}", "1")  # type: ignore[attr-defined]
    store.wait([f"{prefix}/mapped/{rank}" for rank in range(spec.size)])  # type: ignore[attr-defined]
    os.unlink(path)
    return mappings


def _open(path: str) -> mmap.mmap:
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _fast_copies(tensor: torch.Tensor, spec: WindowSpec, addresses: list[int]) -> tuple[Any, Any]:
    """The C (put, get) that check their own arguments, or (None, None) where no tensor reader
    fits this torch (the user layer then checks every call)."""
    reader = tensor_meta_reader()
    if reader is None:
        return None, None
    from commlayer.core import _tensor_meta  # present whenever the reader is

    scalar_type = _tensor_meta.describe(torch.empty(0, dtype=tensor.dtype))[0]
    group_ranks = {rank: index for index, rank in enumerate(spec.global_ranks)}
    return load_extension().window_copies(
        addresses, list(spec.sizes), group_ranks, scalar_type, tensor.element_size(), reader
    )
