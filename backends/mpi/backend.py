"""The ``mpi`` backend: MPI through mpi4py, for jobs started by ``mpirun``.

Tensors reach MPI as zero-copy views of their memory (``MPI.buffer.fromaddress`` over
``data_ptr()``), typed by :mod:`.datatypes`.

MPI never matches a blocking collective with a non-blocking one, and torch lets one rank call
``all_reduce(t)`` while another calls ``all_reduce(t, async_op=True)``. The default mode,
``MpiOptions("ordered")``, makes every collective MPI's blocking call, in call order: a
synchronous op calls it in place, an asynchronous one is queued to the communicator's worker
thread (:mod:`.ordered`). So ranks may disagree on ``async_op`` and synchronous ops run at
blocking-MPI speed (Open MPI's Allreduce is 2-3.7x faster than its Iallreduce from 1 MiB), but a
synchronous op cannot time out. ``MpiOptions("requests")`` makes every collective a non-blocking
request (synchronous ones waited in place, until the group's timeout); ``MpiOptions("blocking")``
blocking calls for synchronous ops and requests for async ones (ranks must then agree on
``async_op``). ``COMMLAYER_MPI_MODE`` picks the mode when no options are given. Sends and receives
are non-blocking in every mode, so a batch of them is posted before anything waits.

Ranks are group ranks and the communicator is the group's own, so they are MPI ranks as they are
(``new_group([1, 3])``: ``broadcast(t, root=0)`` on global rank 3 is ``Bcast(t, root=0)`` on a
two-rank communicator, where global rank 1 sends). Planned ops run its fast paths (:mod:`.fast_paths`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from commlayer.backends.mpi import cuda as _cuda
from commlayer.backends.mpi.collectives import MpiCollectives
from commlayer.backends.mpi.datatypes import MpiTypes
from commlayer.backends.mpi.fast_path_context import MpiFastPathContext
from commlayer.backends.mpi.fast_paths import ordered_fast_path
from commlayer.backends.mpi.options import MODE_ENV, MpiOptions
from commlayer.backends.mpi.ordered import OrderedExecutor, OrderedWork
from commlayer.backends.mpi.requests import CANNOT_CANCEL, MpiWork, wait_in_place
from commlayer.backends.mpi.runtime import (
    INSTALL_HINT,
    MpiLoadError,
    check_launched_by_mpi,
    end_job,
    library_version,
    load_mpi,
    mpi4py_missing_reason,
)
from commlayer.backends.mpi.shared_signatures import open_shared_signatures
from commlayer.backends.mpi.signature import SignatureCheck, verified_call
from commlayer.contract.backend import Backend
from commlayer.contract.fast_paths import FastPath
from commlayer.contract.windows import BackendWindow, WindowSpec
from commlayer.core import health
from commlayer.core.errors import BackendUnavailableError, UnsupportedError, invalid_argument
from commlayer.core.flight_recorder import Recording
from commlayer.core.rendezvous import RendezvousInfo
from commlayer.core.types import Availability, Capabilities, GroupSpec
from commlayer.core.work import CompletedWork, WaitLimit, Work

__all__ = ["MODE_ENV", "MpiBackend", "MpiOptions"]


# Which positional arguments of each op are written, for staging CUDA tensors through the host.
_OUTPUT_ARGUMENTS = {
    "all_reduce": (0,),
    "broadcast": (0,),
    "reduce": (0,),
    "all_gather_into_tensor": (0,),
    "all_gather": (0,),
    "reduce_scatter_tensor": (0,),
    "reduce_scatter": (0,),
    "all_to_all_single": (0,),
    "all_to_all": (0,),
    "gather": (1,),
    "scatter": (0,),
    "send": (),
    "recv": (0,),
    "recv_any": (0,),
}


class MpiBackend(MpiCollectives, Backend):
    """One MPI communicator over ``spec.ranks`` (a duplicate of COMM_WORLD for the world)."""

    name = "mpi"
    capabilities = Capabilities(devices=frozenset({"cpu", "cuda"}), recv_any_source=True)
    install_hint = INSTALL_HINT
    launcher = "mpirun"

    def __init__(
        self, spec: GroupSpec, comm: Any, mpi: ModuleType, cuda_aware: bool, options: MpiOptions
    ) -> None:
        super().__init__(spec)
        self.options = options
        self._mode = options.mode
        self._ordered = OrderedExecutor(spec.name, end_job) if options.mode == "ordered" else None
        self._comm = comm
        self._mpi = mpi
        types = _types_of(mpi)
        self._datatypes, self._reductions = types.datatypes, types.reductions
        self._cuda_aware = cuda_aware
        self._tag_upper_bound = int(comm.Get_attr(mpi.TAG_UB))
        self._in_place = mpi.IN_PLACE
        self._from_address = mpi.buffer.fromaddress
        self._limit = WaitLimit(
            spec.timeout.total_seconds(), spec.global_rank, "MPI", CANNOT_CANCEL, spec.name
        )
        self._check = (
            SignatureCheck.over(
                comm,
                mpi,
                self._datatypes,
                self._reductions,
                self._limit,
                tuple(spec.ranks),
                open_shared_signatures(comm, mpi),
            )
            if options.verify and spec.size > 1
            else None
        )

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    def is_available(cls) -> Availability:
        missing = mpi4py_missing_reason()
        return Availability.yes() if missing is None else Availability.no(missing, INSTALL_HINT)

    @classmethod
    def create_world(cls, spec: GroupSpec) -> MpiBackend:
        try:
            mpi = load_mpi()
        except MpiLoadError as error:
            raise BackendUnavailableError(
                f"init_process_group: backend 'mpi' cannot start (rank {spec.global_rank}): {error}"
            ) from error
        options = MpiOptions.resolve(spec.options, os.environ, spec.global_rank)
        check_launched_by_mpi(mpi, spec)
        return cls(spec, mpi.COMM_WORLD.Dup(), mpi, _cuda.cuda_aware(os.environ), options)

    @classmethod
    def complete_rendezvous(cls, info: RendezvousInfo) -> RendezvousInfo:
        """Rank 0's address and a free port, agreed over MPI (see :mod:`.discovery`)."""
        from commlayer.backends.mpi.discovery import (
            exchange_master_address,  # needs mpi4py: only under mpirun
        )

        return exchange_master_address(info)

    def new_group(self, spec: GroupSpec) -> MpiBackend | None:
        options = (
            self.options
            if spec.options is None
            else MpiOptions.resolve(spec.options, os.environ, spec.global_rank)
        )
        if not spec.is_member:
            return None  # MPI_Comm_create_group is collective over the members only
        members = self._comm.Get_group().Incl([self.spec.ranks.index(rank) for rank in spec.ranks])
        try:
            comm = self._comm.Create_group(members)
        finally:
            members.Free()
        return type(self)(spec, comm, self._mpi, self._cuda_aware, options)

    def shrink(self, survivors: tuple[int, ...], spec: GroupSpec) -> MpiBackend:
        """MPI_Comm_create_group over the survivors, who alone take part in it.

        Raises:
            UnsupportedError: a rank of the job died: without the fault-tolerance extension (ULFM)
                an MPI communicator cannot be rebuilt around a dead process, and the launcher ends
                the job; only ranks excluded while alive can be shrunk away.
        """
        failure = health.current()
        if failure is not None:
            raise UnsupportedError(
                f"shrink_group: the mpi backend cannot shrink a group after rank {failure.rank} died "
                f"({failure.reason}): MPI without the ULFM extension cannot build a communicator "
                f"around a dead process (rank {spec.global_rank})"
            )
        members = self._comm.Get_group().Incl(list(survivors))
        try:
            comm = self._comm.Create_group(members)
        finally:
            members.Free()
        options = (
            self.options
            if spec.options is None
            else MpiOptions.resolve(spec.options, os.environ, spec.global_rank)
        )
        return type(self)(spec, comm, self._mpi, self._cuda_aware, options)

    def shutdown(self) -> None:
        # A worker stuck in a call whose peer never came keeps the communicator: freeing it would crash.
        idle = self._ordered is None or self._ordered.close()
        if self._comm is not None and idle and not self._mpi.Is_finalized():
            if self._check is not None and self._check.shared is not None:
                self._check.shared.free()
            self._comm.Free()
        self._comm = None

    @property
    def library(self) -> str:
        """The MPI library serving this communicator, e.g. ``Open MPI v5.0.11, ...``."""
        return library_version(self._mpi)

    def recorded_plan(self, op: str, fixed: tuple[Any, ...], recording: Recording) -> FastPath | None:
        """Ordered mode's fast path of a planned collective (see Backend.recorded_plan)."""
        if self._ordered is None:
            return None
        context = MpiFastPathContext(
            size=self.size,
            limit=self._limit,
            op_method=functools.partial(getattr, self),
            comm=self._comm,
            mpi=self._mpi,
            rank=self._comm.Get_rank(),
            executor=self._ordered,
            check=self._check,
            datatypes=self._datatypes,
            reductions=self._reductions,
        )
        return ordered_fast_path(context, op, fixed, recording)

    def window(self, tensor: torch.Tensor, spec: WindowSpec) -> BackendWindow:
        """An MPI RMA window (:mod:`.window`) in memory MPI allocates; CUDA tensors get the two-sided one."""
        if tensor.device.type != "cpu":
            return super().window(tensor, spec)
        from commlayer.backends.mpi.window import MpiWindow  # numpy only for programs that use windows

        return MpiWindow(tensor, spec, self._comm, self._mpi)

    # --- point-to-point (the collectives are in ._collectives) --------------------------------

    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool = True) -> Work:
        self._check_tag("send", tag)
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("send", tensor, dst, tag, async_op=async_op)
        return MpiWork(self._comm.Isend(self._message(tensor), dst, tag), "send", self._limit, (), (tensor,))

    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool = True) -> Work:
        self._check_tag("recv", tag)
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("recv", tensor, src, tag, async_op=async_op)
        return MpiWork(
            self._comm.Irecv(self._message(tensor), src, tag), "recv", self._limit, [tensor], (tensor,)
        )

    def recv_any(self, tensor: torch.Tensor, tag: int, *, async_op: bool = True) -> Work:
        self._check_tag("recv", tag)
        if tensor.is_cuda and not self._cuda_aware:
            return self._via_host("recv_any", tensor, tag, async_op=async_op)
        status = self._mpi.Status()
        request = self._comm.Irecv(self._message(tensor), self._mpi.ANY_SOURCE, tag)
        return MpiWork(request, "recv", self._limit, [tensor], (tensor,), status=status)

    # --- helpers ---------------------------------------------------------------------------

    def _collective(
        self,
        op: str,
        async_op: bool,
        calls: tuple[Callable[..., Any], Callable[..., Any]],
        arguments: tuple[Any, ...],
        result: Sequence[torch.Tensor],
        keep_alive: Sequence[Any],
        signature: tuple[int, int] | None,
        epilogue: Callable[[], Any] | None = None,
    ) -> Work:
        """Run one collective given its (blocking, non-blocking) MPI calls, both taking ``arguments``.

        Ordered mode: the blocking call, here or on the worker (see :mod:`.ordered`). Otherwise a
        synchronous op makes the blocking call in "blocking" mode, else waits for the request here:
        on a request no other thread has seen, that skips building a Work and its locks.
        ``signature`` (None when the check is off): checked across ranks first (:mod:`.signature`),
        in the same thread and order as the call itself.
        """
        blocking, nonblocking = calls
        if signature is not None:
            if self._ordered is not None:
                blocking = functools.partial(verified_call, self._check.verify, op, signature, blocking)
            else:
                self._check.verify_within(op, *signature, self._limit)
        if self._ordered is not None:
            if async_op:
                queued = self._ordered.submit(blocking, arguments)
                return OrderedWork(queued, op, self._limit, result, keep_alive, epilogue)
            self._ordered.run(blocking, arguments, op, self._limit)
            return _completed(result, epilogue)
        if not async_op and self._mode == "blocking":
            blocking(*arguments)
            return _completed(result, epilogue)
        request = nonblocking(*arguments)
        if async_op:
            return MpiWork(request, op, self._limit, result, keep_alive, epilogue)
        wait_in_place(request, op, self._limit, keep_alive)
        return _completed(result, epilogue)

    def _signature(
        self, op: str, tensor: torch.Tensor | None, count: int, root: int = -1, reduce_op: Any = None
    ) -> tuple[int, int] | None:
        """What the ranks must agree on for this call, or None when the check is off."""
        if self._check is None:
            return None
        return self._check.key(op, tensor, root, reduce_op), count

    def _message(self, tensor: torch.Tensor, layout: tuple[list[int], list[int]] | None = None) -> list[Any]:
        """``[buffer, datatype]`` (or ``[buffer, (counts, displacements), datatype]``) over the tensor's memory."""
        if tensor.is_cuda:
            _cuda.synchronize_producers(tensor)
        memory = self._from_address(tensor.data_ptr(), tensor.nbytes)
        if layout is None:
            return [memory, self._datatypes[tensor.dtype]]
        return [memory, layout, self._datatypes[tensor.dtype]]

    def _check_tag(self, op: str, tag: int) -> None:
        if not isinstance(tag, int) or not 0 <= tag <= self._tag_upper_bound:
            raise invalid_argument(
                op,
                "tag",
                f"an int in [0, {self._tag_upper_bound}] (MPI's tag range)",
                tag,
                self.spec.global_rank,
            )

    def _via_host(self, op: str, *arguments: Any, async_op: bool) -> Work:
        """Run ``op`` on host copies of the CUDA arguments, then copy its outputs back."""
        _cuda.warn_staging_once(self.library)
        staged = [_cuda.on_host(argument) for argument in arguments]
        work = getattr(self, op)(*staged, async_op=async_op)
        written = _OUTPUT_ARGUMENTS[op]
        devices, hosts = [arguments[index] for index in written], [staged[index] for index in written]
        results = [
            t for value in devices for t in ([value] if isinstance(value, torch.Tensor) else value or ())
        ]
        # The caller gets its device tensors back as the result, not the host copies.
        return work.then(functools.partial(_cuda.copy_back, devices, hosts), result=results)


def _completed(result: Sequence[torch.Tensor], epilogue: Callable[[], Any] | None) -> Work:
    if epilogue is not None:
        epilogue()
    return CompletedWork(result)


@functools.cache
def _types_of(mpi: ModuleType) -> MpiTypes:
    """One table (and one set of user-defined 16-bit float ops) per process."""
    return MpiTypes.build(mpi)
