"""One group's mapped regions and registered segments, and the launcher of its kernels (ctypes).

:mod:`.attach` builds a :class:`PeerComm` collectively; from then on each call is local: a route
from the crossover table, the places of the call's tensors (:mod:`.placement`), one launch on the
caller's stream, or on the group's own for large asynchronous calls (ordered after the group's
previous kernel when that went to another stream: :mod:`.ordering`).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import NamedTuple

import torch

from commlayer.backends.peermem.board import Board
from commlayer.backends.peermem.kernel_library import KernelLibrary
from commlayer.backends.peermem.ordering import EventRing, StreamOrder, on_group_stream
from commlayer.backends.peermem.placement import UNPLACED, Placement
from commlayer.backends.peermem.registry import Registry
from commlayer.backends.peermem.routing import (
    ALL_TO_ALL_BLOCKS,
    ALL_TO_ALL_PUSH_BYTES,
    CROSSOVERS,
    KERNEL_DTYPES,
    choose,
    choose_uneven,
    grid_blocks,
)
from commlayer.backends.peermem.splits import packed_splits
from commlayer.backends.peermem.work import PeerWork
from commlayer.core import settings
from commlayer.core.errors import CommTimeoutError
from commlayer.core.types import GroupSpec, ReduceOp
from commlayer.core.work import Work

__all__ = ["KINDS", "OP_CODES", "PeerComm", "Route", "timeout_error"]

_log = logging.getLogger(__name__)

KINDS = {("all_reduce", "one_shot"): 0, ("all_reduce", "two_shot"): 1}
KINDS.update({("all_gather_into_tensor", "one_shot"): 2, ("reduce_scatter_tensor", "one_shot"): 3})
KINDS.update({("all_reduce", "push"): 4, ("reduce_scatter_tensor", "push"): 5})
KINDS.update({("all_reduce", "one_shot_push"): 6, ("all_reduce", "zero_copy"): 7})
KINDS.update({("all_gather_into_tensor", "zero_copy"): 8, ("reduce_scatter_tensor", "zero_copy"): 9})
OP_CODES = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3, ReduceOp.AVG: 4}
#: Events marking the ends of calls on the group's stream: more than a caller keeps in flight.
_SIDE_EVENTS = 64


class Route(NamedTuple):
    code: int
    blocks: int
    op: str  # set for zero-copy routes (whose tensors are placed), else ""


def _aligned(tensor: torch.Tensor) -> bool:
    return tensor.data_ptr() % 16 == 0


class PeerComm:
    """A group's mapped regions, its registered segments and the launcher of its kernels."""

    def __init__(
        self, lib: KernelLibrary, handle: int, spec: GroupSpec, device: int, half_bytes: int, board: Board
    ) -> None:
        self.lib, self.handle, self.spec, self.device = lib, handle, spec, device
        self.half_bytes, self.board = half_bytes, board
        self.world, self.rank = spec.size, spec.group_rank
        self.forced = settings.PEERMEM_ALGORITHM.value()
        self.table = CROSSOVERS
        #: The all_to_all kernel's grid: one per group, since a rank knows only its own sizes. This
        #: and the push limit are read once by the facade's C fast path, when it is built; the
        #: Python entry (the backend's ``all_to_all_single``) reads them at every call.
        self.all_to_all_blocks = ALL_TO_ALL_BLOCKS
        self.all_to_all_push_bytes = ALL_TO_ALL_PUSH_BYTES
        self._routes: dict[tuple[str, int, torch.dtype, ReduceOp | None], Route | None] = {}
        # The C fast paths' caches of the same routes, one per (op, reduce op), kept here so that
        # force() empties them too.
        self._verdicts: dict[tuple[str, ReduceOp | None], dict[int, object]] = {}
        self._launch = lib.launch
        self._capturing = torch.cuda.is_current_stream_capturing
        registry = Registry(board, self.rank, self.world, lib.max_slots)
        #: Where each zero-copy call's tensors are for the peers (registered segments).
        self.placement = Placement(lib, handle, spec, device, registry, self._capturing, self.launch_failed)
        self._raw_stream = lambda: torch._C._cuda_getCurrentRawStream(device)
        #: Keeps the group's kernels in issue order across streams (FSDP2 issues on two).
        self.order = StreamOrder(self._raw_stream, self._capturing, self._join)
        self._stream = self.order.stream
        self.async_bytes = settings.PEERMEM_ASYNC_BYTES.value()
        #: The device's default stream (raw handle): large async calls issued there move to the group's.
        self.default_stream = torch.cuda.default_stream(device).cuda_stream
        # The group's own stream, created at the first large async call, with the events that
        # mark its calls' ends (see _new_side).
        self._side: torch.cuda.Stream | None = None
        self._side_ends: EventRing | None = None
        # Joins one stream to another's work so far; one event serves every join, since a wait
        # takes the event's latest record when it is enqueued.
        self._join_event: torch.cuda.Event | None = None
        #: Nonzero once a call of this group timed out (host-mapped, written by the kernel).
        self.failed = ctypes.c_int.from_address(lib.lib.pm_error_address(handle))

    def force(self, algorithm: str | None) -> None:
        """Route every call the kernels can serve to ``algorithm`` (None: the crossover table), from
        the next call on: benchmarks and checks compare the algorithms on one group."""
        self.forced = algorithm
        self._routes.clear()
        for table in self._verdicts.values():
            table.clear()

    def verdict_table(self, op: str, reduce_op: ReduceOp | None) -> dict[int, object]:
        """The table a C fast path of ``op`` caches its routes in (emptied by :meth:`force`)."""
        return self._verdicts.setdefault((op, reduce_op), {})

    def route(self, op: str, nbytes: int, dtype: torch.dtype, reduce_op: ReduceOp | None) -> Route | None:
        """The kernel that serves this kind of call, or None for NCCL."""
        key = (op, nbytes, dtype, reduce_op)
        try:
            return self._routes[key]
        except KeyError:
            pass
        route = None
        dtype_code = KERNEL_DTYPES.get(dtype)
        op_code = OP_CODES.get(reduce_op, 0) if reduce_op is not None else 0
        if dtype_code is not None and (reduce_op is None or reduce_op in OP_CODES):
            algorithm = choose(self.table, op, nbytes, self.world, self.half_bytes, self.forced)
            if algorithm != "nccl":
                code = KINDS[op, algorithm] | dtype_code << 4 | op_code << 8
                placed = op if algorithm == "zero_copy" else ""
                route = Route(code, grid_blocks(op, algorithm, nbytes, self.world), placed)
        self._routes[key] = route
        return route

    def launch(
        self, route: Route, source: torch.Tensor, output: torch.Tensor, nbytes: int, async_op: bool
    ) -> Work:
        """Start the kernel on the current stream; ``nbytes`` is what the kernel's ``bytes`` means."""
        if not (_aligned(source) and _aligned(output)):
            return self._launch_aligned(route, source, output, nbytes, async_op)
        places = self.placement.places(route.op, source, output) if route.op else UNPLACED
        stream, side = self._stream_for(async_op, max(source.nbytes, output.nbytes))
        rc = self._launch(
            self.handle,
            route.code,
            source.data_ptr(),
            output.data_ptr(),
            nbytes,
            route.blocks,
            stream,
            *places,
        )
        return self._started(rc, output, async_op, side, source)

    def _launch_aligned(
        self, route: Route, source: torch.Tensor, output: torch.Tensor, nbytes: int, async_op: bool
    ) -> Work:
        # The kernels move 16-byte units; every rank must still take the kernel (a peer cannot
        # know this rank's offsets), so an unaligned view travels through an aligned copy.
        staged_source = source if _aligned(source) else source.clone()
        staged_output = output if _aligned(output) else torch.empty_like(output)
        if output.data_ptr() == source.data_ptr():
            staged_output = staged_source
        self.launch(route, staged_source, staged_output, nbytes, False)
        if staged_output is not output:
            output.copy_(staged_output)
        return self._started(0, output, async_op)

    def _stream_for(self, async_op: bool, nbytes: int) -> tuple[int, torch.cuda.Stream | None]:
        """The stream to launch on, and the group's own stream when that is it.

        Large asynchronous calls from the default stream run on the group's stream, after the
        caller's work so far, so that they overlap the compute the caller queues next (ZeRO's
        prefetches and reductions), as NCCL's run on its own stream; the others, and every call
        captured in a graph, run on the caller's stream, where small calls start soonest.
        """
        if (
            not on_group_stream(async_op, nbytes, self.async_bytes, self._on_default_stream)
            or self._capturing()
        ):
            return self._stream(), None
        side = self._side if self._side is not None else self._new_side()
        self._join(side.cuda_stream, self._raw_stream())
        return self.order.enter(side.cuda_stream), side

    def _new_side(self) -> torch.cuda.Stream:
        """The group's own stream, with the events that mark its calls' ends made once."""
        side = self._side = torch.cuda.Stream(self.device)
        self._side_ends = EventRing(_SIDE_EVENTS, lambda: self._created_event(side))
        return side

    @staticmethod
    def _created_event(stream: torch.cuda.Stream) -> torch.cuda.Event:
        """An event whose CUDA event exists (its handle is read from now on, recorded in C)."""
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def _join(self, waiting: int, after: int) -> None:
        """Make stream ``waiting`` wait for the work enqueued on stream ``after`` so far (raw
        handles; recorded and waited for by the kernel library)."""
        if self._join_event is None:
            self._join_event = self._created_event(torch.cuda.current_stream(self.device))
        event = self._join_event.cuda_event
        self._checked(self.lib.record(event, after) or self.lib.wait(waiting, event))

    def wait_for(self, event: torch.cuda.Event) -> None:
        """Make the current stream wait for ``event``, recorded after one of the group's kernels."""
        self._checked(self.lib.wait(self._raw_stream(), event.cuda_event))

    def _checked(self, rc: int) -> None:
        if rc:
            self.launch_failed(rc)

    def _on_default_stream(self) -> bool:
        return self._raw_stream() == self.default_stream

    def _started(
        self,
        rc: int,
        output: torch.Tensor,
        async_op: bool,
        side: torch.cuda.Stream | None = None,
        source: torch.Tensor | None = None,
    ) -> Work:
        self._checked(rc)
        if side is not None:
            event = self._side_ends.take()
            self._checked(self.lib.record(event.cuda_event, side.cuda_stream))
            return PeerWork(self, (output,), event, (side, (output, source)))
        event = None
        if async_op:
            event = torch.cuda.Event()
            event.record()
        return PeerWork(self, (output,), event)

    def started_work(self, output: torch.Tensor) -> Work:
        """The Work of an asynchronous kernel just launched on the current stream."""
        return self._started(0, output, True)

    def serves_all_to_all(self) -> bool:
        """Whether the kernel serves this group's all_to_all_single calls (all of them, or none)."""
        return choose_uneven(self.table, self.world, self.forced) != "nccl"

    def all_to_all(
        self,
        output: torch.Tensor,
        source: torch.Tensor,
        output_splits: Sequence[int] | None,
        input_splits: Sequence[int] | None,
        async_op: bool,
    ) -> Work | None:
        """all_to_all_single on the kernel, or None when NCCL must serve it.

        One choice per group, whatever the splits: a rank knows only its own sizes, and one rank
        may pass even splits as None where another lists them.
        """
        if not self.serves_all_to_all():
            return None
        if not (_aligned(source) and _aligned(output)):
            staged = torch.empty_like(output)
            self.all_to_all(staged, source.clone(), output_splits, input_splits, False)
            output.copy_(staged)
            return self._started(0, output, async_op)
        nbytes = source.numel() * source.element_size()
        splits = packed_splits(source, output, input_splits, output_splits, self.world)
        in_slot, _, in_off, _, descriptor = self.placement.places("all_to_all_single", source, output)
        stream, side = self._stream_for(async_op, nbytes)
        rc = self.lib.all_to_all(
            self.handle,
            source.data_ptr(),
            output.data_ptr(),
            nbytes,
            splits,
            self.all_to_all_blocks,
            stream,
            in_slot,
            in_off,
            descriptor,
            self.all_to_all_push_bytes,
        )
        return self._started(rc, output, async_op, side, source)

    def fused_norm(
        self,
        partial: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        normed: torch.Tensor,
        residual_out: torch.Tensor,
    ) -> bool:
        """all_reduce(partial) + residual, RMSNorm'd, in one kernel; False when it cannot serve
        (a size or dtype every rank shares, so every rank falls back alike)."""
        hidden = partial.shape[-1]
        rows = partial.numel() // max(hidden, 1)
        row_bytes = hidden * partial.element_size()
        dtype = KERNEL_DTYPES.get(partial.dtype)
        if dtype is None or rows == 0 or row_bytes % 16 or rows * row_bytes * self.world > self.half_bytes:
            return False
        # A peer cannot know this rank's offsets: unaligned inputs travel as aligned copies.
        partial, residual, weight = (t if _aligned(t) else t.clone() for t in (partial, residual, weight))
        tensors = (partial, residual, weight, normed, residual_out)
        if not (_aligned(normed) and _aligned(residual_out)):
            raise ValueError("peermem fused_norm: the outputs must be 16-byte aligned (allocate them fresh)")
        blocks = max(1, min(rows, 128))
        pointers = [t.data_ptr() for t in tensors]
        rc = self.lib.fused_norm(
            self.handle, dtype, *pointers, rows, hidden, float(eps), blocks, self._stream()
        )
        if rc:
            self.launch_failed(rc)
        return True

    def launch_failed(self, rc: int) -> None:
        """Raise the error of a launch that returned ``rc`` (a peer's timeout, or CUDA's error)."""
        if rc == -2:
            self.raise_if_failed("collective")
        raise RuntimeError(
            f"peermem: kernel launch failed on rank {self.spec.group_rank}: {self.lib.error_string(rc)}"
        )

    def raise_if_failed(self, name: str) -> None:
        """Raise CommTimeoutError, naming the peer, once any earlier call of this group timed out."""
        peer, block = ctypes.c_int(), ctypes.c_int()
        if self.lib.lib.pm_error(self.handle, ctypes.byref(peer), ctypes.byref(block)):
            raise timeout_error(self.spec, peer.value, name)

    def close(self) -> None:
        """Free the region once every member has stopped using it (or the wait for them ended)."""
        if self.handle is None:
            return
        torch.cuda.synchronize(self.device)
        prefix = f"commlayer/peermem/{self.spec.name}"
        self.spec.store.set(f"{prefix}/closed/{self.spec.group_rank}", b"1")
        keys = [f"{prefix}/closed/{rank}" for rank in range(self.world)]
        try:
            self.spec.store.wait(keys, min(self.spec.timeout, timedelta(seconds=60)))
        except Exception as error:  # noqa: BLE001 - a dead peer must not keep this rank's memory forever
            _log.warning(
                "peermem: freeing group '%s' without every peer's goodbye: %s", self.spec.name, error
            )
        self.lib.lib.pm_destroy(self.handle)
        self.handle = None
        self.board.close()


def timeout_error(spec: GroupSpec, missing: int, name: str) -> CommTimeoutError:
    """The error of a call whose kernel waited ``spec.timeout`` for group rank ``missing``."""
    return CommTimeoutError(
        f"peermem {name}: group rank {missing} (global rank {spec.ranks[missing]}) did not reach a "
        f"collective within {spec.timeout} (group '{spec.name}', waiting rank {spec.group_rank}); "
        "the group's peer-memory state is unusable: destroy the group"
    )
