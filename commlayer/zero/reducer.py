"""Averaging one segment's gradient over the data-parallel group, asynchronously.

A segment whose gradient buffer is complete is reduced with one collective: ``all_reduce`` when
every rank keeps the whole segment (stage 0), ``reduce_scatter_tensor`` otherwise, so rank ``r``
ends up with the sum of shard ``r`` only. Outputs never alias inputs: NCCL allows that, MPI
forbids it, and the engine must run on every backend. The buffer is divided by the number of data-parallel ranks
*before* the sum, which keeps fp16 sums in range. With hybrid sharding (:mod:`.hybrid`) the
piece is then all-reduced with the rank's replicas. When the collective completes, the rank's
piece is handed to the master shard, which keeps it in the reduction dtype and folds it into
the fp32 gradient only when the step (or the next micro-step's accumulation) needs it. Start order is the caller's business: every rank must start the same
segments in the same order, since each is one collective on a shared communicator.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from commlayer import dist
from commlayer.dist import ProcessGroup, Work
from commlayer.zero.master import MasterShard
from commlayer.zero.partition import Segment

__all__ = ["GradientReducer"]


@dataclass(frozen=True)
class _InFlight:
    segment: Segment
    work: Work
    piece: torch.Tensor  # this rank's reduced part
    source: torch.Tensor  # kept alive until the collective completes


class GradientReducer:
    """Starts segment reductions and folds finished ones into the master gradient."""

    def __init__(
        self,
        group: ProcessGroup,
        master: MasterShard,
        reduce_dtype: torch.dtype,
        max_in_flight: int | None,
        *,
        replica_group: ProcessGroup | None = None,
        divisor: int | None = None,
    ) -> None:
        self.group = group
        self.replica_group = replica_group
        self.master = master
        self.reduce_dtype = reduce_dtype
        self.size = group.size()
        # Every data-parallel rank's gradient counts once: the shard group times its replicas
        # (expert gradients pass the whole data-parallel size, see .experts).
        self.divisor = divisor or self.size * (replica_group.size() if replica_group is not None else 1)
        self.rank = group.rank()
        self.max_in_flight = max_in_flight
        self._in_flight: deque[_InFlight] = deque()
        self._replicating: deque[_InFlight] = deque()

    def stage(self, destination: torch.Tensor, grad: torch.Tensor) -> None:
        """Write ``grad`` into a scratch buffer's slice already divided, in one pass instead of
        a copy and a division of the whole buffer (start it with ``prescaled=True``)."""
        source = grad.reshape(-1)
        if self.divisor > 1:
            torch.div(source, self.divisor, out=destination)
        else:
            destination.copy_(source)

    def stage_consecutive(self, destination: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
        """:meth:`stage` for gradients that fill ``destination`` end to end, in a kernel or two for
        all of them instead of one each; the values are exactly :meth:`stage`'s (divided in the
        gradients' dtype, then widened where the buffer's is wider)."""
        flat = [grad.reshape(-1) for grad in grads]
        dtype = flat[0].dtype
        if any(tensor.dtype != dtype for tensor in flat):
            for tensor, target in zip(flat, destination.split([t.numel() for t in flat])):
                self.stage(target, tensor)
            return
        joined = destination if dtype == destination.dtype else torch.empty_like(destination, dtype=dtype)
        torch.cat(flat, out=joined)
        if self.divisor > 1:
            joined.div_(self.divisor)
        if joined is not destination:
            destination.copy_(joined)

    def start(self, segment: Segment, buffer: torch.Tensor, *, prescaled: bool = False) -> None:
        """Start averaging ``buffer`` (the segment's whole padded gradient) over the group.

        The buffer is overwritten (divided unless ``prescaled`` -- filled through :meth:`stage`
        --, and summed into by all_reduce), so pass a scratch buffer or one zeroed afterwards.
        """
        source = buffer if buffer.dtype == self.reduce_dtype else buffer.to(self.reduce_dtype)
        if self.divisor > 1 and not prescaled:
            source.div_(self.divisor)
        if self.master.layout.shards == 1:
            piece = source
            work = dist.all_reduce(source, group=self.group, async_op=True)
        else:
            piece = torch.empty(segment.shard_numel, dtype=source.dtype, device=source.device)
            work = dist.reduce_scatter_tensor(piece, source, group=self.group, async_op=True)
        self._in_flight.append(_InFlight(segment, work, piece, source))
        # Bounding the reductions in flight bounds the scratch buffers alive at once.
        while self.max_in_flight is not None and len(self._in_flight) > self.max_in_flight:
            self._finish_oldest()

    def drain(self) -> None:
        """Wait for every reduction and hand its piece to the master shard."""
        while self._in_flight:
            self._finish_oldest()
        while self._replicating:
            done = self._replicating.popleft()
            done.work.wait()
            self.master.accept_piece(done.segment, done.piece)

    def _finish_oldest(self) -> None:
        done = self._in_flight.popleft()
        done.work.wait()
        if self.replica_group is None:
            self.master.accept_piece(done.segment, done.piece)
            return
        # Hybrid sharding: only the shard-sized piece crosses to the replicas.
        work = dist.all_reduce(done.piece, group=self.replica_group, async_op=True)
        self._replicating.append(_InFlight(done.segment, work, done.piece, done.piece))
