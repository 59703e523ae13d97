"""The ``mpi`` backend's native window: MPI one-sided communication (RMA) with passive-target sync.

Two MPI windows per commlayer window, both opened with ``Lock_all`` at creation and closed by
``Unlock_all`` at ``free``: the data window exposes the registered tensor's own memory
(``Win.Create``, so ``Window.tensor`` *is* the registered tensor), and a small signal window
holds one int64 counter per source rank. A put is ``Put`` + ``Flush(dst)``, a get ``Get`` +
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

from commlayer.one_sided import BackendWindow, PollWork, WindowSpec
from commlayer.one_sided.contract import group_timeout, signal_timeout
from commlayer.work import CompletedWork, Work, poll_until

__all__ = ["MpiWindow"]

_COMPLETED = CompletedWork()


class MpiWindow(BackendWindow):
    """One commlayer window over MPI RMA; see the module docstring."""

    def __init__(self, tensor: torch.Tensor, spec: WindowSpec, comm: Any, mpi: ModuleType) -> None:
        super().__init__(tensor, spec)
        self._mpi, self._comm = mpi, comm
        self._itemsize = tensor.element_size()
        self._address = mpi.buffer.fromaddress
        memory = mpi.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes) if tensor.nbytes else None
        self._data = mpi.Win.Create(memory if memory is not None else mpi.BOTTOM, 1, mpi.INFO_NULL, comm)
        self._flags = mpi.Win.Allocate(8 * spec.size, 8, mpi.INFO_NULL, comm)
        np.frombuffer(self._flags.tomemory(), dtype=np.int64)[:] = 0
        comm.Barrier()  # every counter is zero before any rank can add to one
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
