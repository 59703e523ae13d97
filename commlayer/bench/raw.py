"""References measured in the same ``commlayer bench`` run as the backends, without commlayer.

- ``mpi4py``: the library itself, mpi4py's blocking (or, async, non-blocking) calls on the tensors'
  memory, as a user of MPI would write them. It offers the facade's call signatures, so the bench
  cases run on it unchanged. Needs an MPI launcher (as the ``mpi`` backend does).
  ``put``/``get`` run on a raw MPI window (:class:`RawMpiWindow`).
- ``memcpy``: each rank copies S bytes from one buffer to another (libc memcpy, one core), all ranks
  at once: the memory bandwidth shared-memory transports are bounded by.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch

__all__ = ["RAW_BACKENDS", "MemcpyCalls", "RawMpiCalls", "RawMpiWindow"]

#: Names ``--backends`` accepts besides registered backends.
RAW_BACKENDS = ("mpi4py", "memcpy")


class _Request:
    def __init__(self, request: Any) -> None:
        self._request = request

    def wait(self) -> bool:
        self._request.Wait()
        return True


class RawMpiCalls:
    """``dist``-shaped calls that go straight to mpi4py on COMM_WORLD (``group`` is ignored)."""

    def __init__(self) -> None:
        from commlayer.backends.mpi.runtime import load_mpi  # the libmpi the launcher belongs to

        mpi = load_mpi()
        self._comm = mpi.COMM_WORLD.Dup()
        self._in_place = mpi.IN_PLACE
        self._float_types = {
            torch.float32: mpi.FLOAT,
            torch.float64: mpi.DOUBLE,
            torch.int32: mpi.INT32_T,
            torch.int64: mpi.INT64_T,
            torch.int8: mpi.INT8_T,
            torch.uint8: mpi.UINT8_T,
        }
        self._from_address = mpi.buffer.fromaddress
        self._views: dict[tuple[int, int], list[Any]] = {}  # built once per buffer: not timed

    def close(self) -> None:
        self._comm.Free()

    def _buffer(self, tensor: torch.Tensor) -> list[Any]:
        key = (tensor.data_ptr(), tensor.nbytes)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = [self._from_address(key[0], key[1]), self._float_types[tensor.dtype]]
        return view

    def _run(self, blocking: Any, nonblocking: Any, async_op: bool, *arguments: Any) -> _Request | None:
        if async_op:
            return _Request(nonblocking(*arguments))
        blocking(*arguments)
        return None

    def all_reduce(self, tensor: torch.Tensor, group: Any = None, async_op: bool = False) -> Any:
        c = self._comm
        return self._run(c.Allreduce, c.Iallreduce, async_op, self._in_place, self._buffer(tensor))

    def broadcast(self, tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False) -> Any:
        return self._run(self._comm.Bcast, self._comm.Ibcast, async_op, self._buffer(tensor), src)

    def all_gather_into_tensor(
        self, out: torch.Tensor, inp: torch.Tensor, group: Any = None, async_op: bool = False
    ) -> Any:
        c = self._comm
        return self._run(c.Allgather, c.Iallgather, async_op, self._buffer(inp), self._buffer(out))

    def reduce_scatter_tensor(
        self, out: torch.Tensor, inp: torch.Tensor, group: Any = None, async_op: bool = False
    ) -> Any:
        c = self._comm
        return self._run(
            c.Reduce_scatter_block, c.Ireduce_scatter_block, async_op, self._buffer(inp), self._buffer(out)
        )

    def all_to_all_single(
        self, out: torch.Tensor, inp: torch.Tensor, group: Any = None, async_op: bool = False
    ) -> Any:
        c = self._comm
        return self._run(c.Alltoall, c.Ialltoall, async_op, self._buffer(inp), self._buffer(out))

    def barrier(self, group: Any = None, async_op: bool = False) -> Any:
        return self._run(self._comm.Barrier, self._comm.Ibarrier, async_op)

    def send(self, tensor: torch.Tensor, dst: int, group: Any = None) -> None:
        self._comm.Send(self._buffer(tensor), dst)

    def recv(self, tensor: torch.Tensor, src: int, group: Any = None) -> None:
        self._comm.Recv(self._buffer(tensor), src)

    def window(self, tensor: torch.Tensor) -> RawMpiWindow:
        return RawMpiWindow(self._comm, tensor)


class RawMpiWindow:
    """A raw MPI RMA window as a user of mpi4py would write it: ``Win.Allocate`` (MPI's memory,
    which MPI maps between the ranks of a node; memory from ``Win.Create`` makes a put wait until
    the target calls MPI), ``Lock_all`` once, ``Put``/``Get`` + ``Flush(target)`` per op. Its
    ``tensor`` views the window's memory, initialised from the given tensor."""

    def __init__(self, comm: Any, tensor: torch.Tensor) -> None:
        from commlayer.backends.mpi.runtime import load_mpi

        mpi = load_mpi()
        self._comm, self._byte = comm, mpi.BYTE
        self._from_address = mpi.buffer.fromaddress
        self._win = mpi.Win.Allocate(max(1, tensor.nbytes), 1, mpi.INFO_NULL, comm)
        memory = torch.frombuffer(self._win.tomemory(), dtype=torch.uint8, count=max(1, tensor.nbytes))
        self.tensor = memory[: tensor.nbytes].view(tensor.dtype).view(tensor.shape)
        self.tensor.copy_(tensor)
        comm.Barrier()
        self._win.Lock_all(mpi.MODE_NOCHECK)
        self._views: dict[tuple[int, int], Any] = {}  # built once per buffer: not timed

    def _message(self, tensor: torch.Tensor) -> list[Any]:
        key = (tensor.data_ptr(), tensor.nbytes)
        view = self._views.get(key)
        if view is None:
            view = self._views[key] = [self._from_address(key[0], key[1]), self._byte]
        return view

    def put(self, tensor: torch.Tensor, dst: int, offset: int = 0, async_op: bool = False) -> None:
        self._win.Put(self._message(tensor), dst, (offset * tensor.element_size(), tensor.nbytes, self._byte))
        self._win.Flush(dst)

    def get(self, tensor: torch.Tensor, src: int, offset: int = 0, async_op: bool = False) -> None:
        self._win.Get(self._message(tensor), src, (offset * tensor.element_size(), tensor.nbytes, self._byte))
        self._win.Flush(src)

    def fence(self) -> None:
        self._win.Flush_all()
        self._comm.Barrier()
        self._win.Sync()

    def free(self) -> None:
        self._win.Unlock_all()
        self._win.Free()


class MemcpyCalls:
    """Every op is one copy of the op's S bytes from a source buffer into its output."""

    def close(self) -> None:
        """Nothing to release."""

    def copy(self, target: torch.Tensor, source: torch.Tensor) -> None:
        ctypes.memmove(target.data_ptr(), source.data_ptr(), min(target.nbytes, source.nbytes))
