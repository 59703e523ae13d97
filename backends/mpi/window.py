"""The ``mpi`` backend's native window: MPI one-sided communication (RMA) with passive-target sync.

Two MPI windows per commlayer window, both opened with ``Lock_all`` at creation and closed by
``Unlock_all`` at ``free``: the data window, whose memory MPI allocates (``Win.Allocate_shared``
when the group shares a node, so the library moves data with plain loads and stores and never
needs the target to progress; ``Win.Allocate`` otherwise) and ``Window.tensor`` views,
initialised from the registered tensor; and a small signal window holding one int64 counter per
source rank. Where memory is shared, ``map(peer)`` is the peer's memory (``Win.Shared_query``). A put is ``Put`` + ``Flush(dst)``, a get ``Get`` +
``Flush(src)``: both complete remotely when they return. A signal is an ``Accumulate(SUM)`` of 1
into the target's counter for this rank, after the flushed puts, so it is ordered after them;
``wait_signal`` polls its own counter with ``Fetch_and_op(NO_OP)`` + ``Flush`` (accumulate-family
calls are atomic with respect to each other, and each poll lets the library progress), bounded.
``fence`` flushes everything, then meets the group in an ``Ibarrier`` it polls until the group's
timeout, then ``Win.Sync`` makes the peers' writes visible to local loads.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import torch

from commlayer.contract.windows import BackendWindow, PollWork, WindowSpec, group_timeout, signal_timeout
from commlayer.core.work import CompletedWork, Work, poll_until

__all__ = ["MpiWindow"]

_COMPLETED = CompletedWork()


class MpiWindow(BackendWindow):
    """One commlayer window over MPI RMA; see the module docstring."""

    def __init__(self, tensor: torch.Tensor, spec: WindowSpec, comm: Any, mpi: ModuleType) -> None:
        self._mpi, self._comm = mpi, comm
        self._itemsize = tensor.element_size()
        self._address = mpi.buffer.fromaddress
        node = comm.Split_type(mpi.COMM_TYPE_SHARED)
        self.mappable = node.Get_size() == comm.Get_size()
        node.Free()
        allocate = mpi.Win.Allocate_shared if self.mappable else mpi.Win.Allocate
        self._data = allocate(max(1, tensor.nbytes), 1, mpi.INFO_NULL, comm)
        self._flags = allocate(8 * spec.size, 8, mpi.INFO_NULL, comm)
        self._memory = [self._data.tomemory()]
        local = _view(self._memory[0], tensor.numel(), tensor.dtype)
        local.copy_(tensor.reshape(-1))
        super().__init__(local.view(tensor.shape), spec)
        np.frombuffer(self._flags.tomemory(), dtype=np.int64)[:] = 0
        comm.Barrier()  # contents and counters are set before any rank can reach them
        self._data.Lock_all(mpi.MODE_NOCHECK)
        self._flags.Lock_all(mpi.MODE_NOCHECK)
        self._one = np.ones(1, dtype=np.int64)
        self._seen = np.zeros(1, dtype=np.int64)
        self._consumed = [0] * spec.size

    def put(self, src: torch.Tensor, dst: int, offset: int, *, async_op: bool) -> Work:
        nbytes = src.numel() * self._itemsize
        if nbytes:
            byte = self._mpi.BYTE
            self._data.Put(
                [self._address(src.data_ptr(), nbytes), byte], dst, (offset * self._itemsize, nbytes, byte)
            )
            self._data.Flush(dst)
        return _COMPLETED

    def get(self, out: torch.Tensor, src: int, offset: int, *, async_op: bool) -> Work:
        nbytes = out.numel() * self._itemsize
        if nbytes:
            byte = self._mpi.BYTE
            self._data.Get(
                [self._address(out.data_ptr(), nbytes), byte], src, (offset * self._itemsize, nbytes, byte)
            )
            self._data.Flush(src)
        return _COMPLETED

    def signal(self, dst: int, *, async_op: bool) -> Work:
        mpi = self._mpi
        self._flags.Accumulate([self._one, mpi.INT64_T], dst, (self.spec.rank, 1, mpi.INT64_T), mpi.SUM)
        self._flags.Flush(dst)
        return _COMPLETED

    def wait_signal(self, src: int, timeout_s: float, *, async_op: bool) -> Work:
        self._consumed[src] += 1
        wanted = self._consumed[src]

        def arrived() -> bool:
            return self._signals_from(src) >= wanted

        def expired() -> Exception:
            self._consumed[src] -= 1  # a wait that timed out consumed no signal
            return signal_timeout(self.spec, src, timeout_s)

        work = PollWork(arrived, timeout_s, expired)
        if not async_op:
            work.wait()
        return work

    def fence(self, *, async_op: bool) -> Work:
        self._data.Flush_all()
        self._flags.Flush_all()
        request = self._comm.Ibarrier()
        if not poll_until(request.Test, self.spec.timeout_s):
            raise group_timeout("fence", self.spec)
        self._data.Sync()
        return _COMPLETED

    def map(self, peer: int) -> torch.Tensor:
        if not self.mappable:
            return super().map(peer)
        memory, _ = self._data.Shared_query(peer)
        self._memory.append(memory)
        return _view(memory, self.spec.sizes[peer], self.tensor.dtype)

    def close(self) -> None:
        """Collective (``Win.Free``); the user layer calls it from ``Window.free`` after a fence."""
        for window in (self._data, self._flags):
            window.Unlock_all()
            window.Free()

    def _signals_from(self, src: int) -> int:
        mpi = self._mpi
        me = self.spec.rank
        self._flags.Fetch_and_op([self._one, mpi.INT64_T], [self._seen, mpi.INT64_T], me, src, mpi.NO_OP)
        self._flags.Flush(me)
        return int(self._seen[0])


def _view(memory: Any, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The first ``numel`` elements of an MPI window's memory as a tensor (no copy)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer(memory, dtype=torch.uint8, count=max(1, numel * itemsize))[
        : numel * itemsize
    ].view(dtype)
