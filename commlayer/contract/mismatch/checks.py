"""The checks a backend holds: each verifies one call's signature across the group before the
call is issued, and raises the same :class:`~commlayer.core.errors.CollectiveMismatchError` on
every rank when the calls differ.

- :class:`SharedMemoryCheck`: every rank's signature in shared memory (:mod:`.shared_slots`), for
  a group on one host: a fraction of a microsecond when the peers are there.
- :class:`ReductionCheck`: one MAX all-reduce of ``[key, -key, count, -count]`` through the
  backend's own library, for a group across hosts: one small round trip.
- :func:`group_check`: picks one of the two when the group is built (collective).

A blocking call that completes only once every rank has entered it (all_reduce, say) may
*speculate* through shared memory (:meth:`MismatchCheck.speculate`): a rank whose published peers
agree enters at once rather than wait for the rest, and compares once its call returned
(:meth:`Speculation.confirm`). Waiting is what costs: it serialises the ranks' arrivals, which the
library's own round trip would overlap. A late rank that then finds a mismatch runs the
speculator's call on scratch memory (the backend's ``replay``) so that it completes, and every
rank raises; the speculator's output then holds what that call produced.

A mismatch found by a reduction knows only the group's extremes; every rank then takes part in
one more reduction that gathers each rank's call, so its message names the first differing peer
as the shared-memory check does.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.contract.mismatch.host_segment import host_signatures
from commlayer.contract.mismatch.shared_slots import AGREED, PENDING, SharedSignatures
from commlayer.contract.mismatch.signature import (
    agree,
    checked_after,
    checked_before,
    describe,
    describe_key,
    first_differing,
    mismatch_error,
    pack,
)
from commlayer.core import call_deadline, profiling
from commlayer.core.errors import CommTimeoutError
from commlayer.core.types import GroupSpec
from commlayer.core.work import WaitLimit

__all__ = [
    "Members",
    "MismatchCheck",
    "ReductionCheck",
    "Replay",
    "SharedMemoryCheck",
    "Speculation",
    "group_check",
    "split_counts",
]

_UNKNOWN = -(1 << 62)  # below any element count or key, and below any negated one
# ``replay(key, count)``: the call a peer published as (key, count), run on scratch memory.
Replay = Callable[[int, int], None]


@dataclass(frozen=True)
class Members:
    """Who a check speaks for: the group's name, its global ranks by group rank, and this rank."""

    name: str
    ranks: tuple[int, ...]
    group_rank: int

    @classmethod
    def of(cls, spec: GroupSpec) -> Members:
        return cls(spec.name, tuple(spec.ranks), spec.group_rank)

    @property
    def rank(self) -> int:
        """This rank's global rank."""
        return self.ranks[self.group_rank]


class MismatchCheck(ABC):
    """Verifies calls across one group before they are issued; ``checked_by`` names the backend."""

    def __init__(self, members: Members, backend: str) -> None:
        self.members, self.backend = members, backend

    @abstractmethod
    def verify(
        self, op: str, dtype: torch.dtype | None, count: int, root: int = -1, reduce_op: Any = None
    ) -> None:
        """Raise CollectiveMismatchError on every rank unless all ranks pass this call."""

    def speculate(
        self, op: str, dtype: torch.dtype | None, count: int, root: int = -1, reduce_op: Any = None
    ) -> Speculation | None:
        """:meth:`verify` for a blocking call that completes only once every rank has entered it.
        A check that can may let this rank enter before every peer has published; it returns the
        :class:`Speculation` to confirm once the call returned. None: the call was verified."""
        self.verify(op, dtype, count, root, reduce_op)
        return None

    @abstractmethod
    def verify_exchange(
        self, op: str, dtype: torch.dtype, sends: Sequence[int], receives: Sequence[int]
    ) -> None:
        """An all-to-all's check: op and dtype, and every pair's element count. ``sends[j]`` is
        what this rank sends to group rank j, ``receives[j]`` what it expects from j."""

    def verify_all_to_all_single(
        self,
        op: str,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: Sequence[int] | None,
        input_splits: Sequence[int] | None,
    ) -> None:
        """An all_to_all_single's check: every pair's count when the splits are uneven (they
        differ between ranks legitimately), else op, dtype and count like any collective."""
        if output_splits or input_splits:
            counts = split_counts(output, tensor, list(output_splits or ()), list(input_splits or ()))
            self.verify_exchange(op, tensor.dtype, *counts)
        else:
            self.verify(op, tensor.dtype, tensor.numel())

    def verify_all_to_all(
        self, op: str, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
    ) -> None:
        """An all_to_all's check over tensor lists: each pair's count (per-peer sizes may differ)."""
        sends, receives = [chunk.numel() for chunk in inputs], [chunk.numel() for chunk in outputs]
        self.verify_exchange(op, inputs[0].dtype, sends, receives)

    def mismatch(self, op: str, calls: Sequence[tuple[int, int]], after_call: bool = False) -> Exception:
        """The error naming this rank's call and the first differing peer's; ``calls[r]`` is group
        rank r's ``(key, count)``; ``after_call``: found by a speculating rank once its call ran."""
        me, ranks = self.members.group_rank, self.members.ranks
        peer = first_differing(calls[me], calls, me)
        described = ((ranks[me], describe_key(*calls[me])), (ranks[peer], describe_key(*calls[peer])))
        checked = checked_after(self.backend) if after_call else checked_before(self.backend)
        return mismatch_error(op, self.members.name, described, checked)

    def exchange_mismatch(
        self, op: str, dtype: torch.dtype, sender: int, receiver: int, counts: tuple[int, int]
    ) -> Exception:
        """The error of an exchange whose group ranks ``sender`` and ``receiver`` disagree on how
        many elements pass between them: ``counts`` is (sent, expected)."""
        ranks, me = self.members.ranks, self.members.group_rank
        kind = describe(op, dtype)[:-1]  # "all_to_all(float32"
        sends = f"{kind}, sending {counts[0]} to rank {ranks[receiver]})"
        expects = f"{kind}, expecting {counts[1]} from rank {ranks[sender]})"
        if me == receiver:
            calls = ((ranks[receiver], expects), (ranks[sender], sends))
        else:
            calls = ((ranks[sender], sends), (ranks[receiver], expects))
        seen_by = None if me in (sender, receiver) else ranks[me]
        return mismatch_error(op, self.members.name, calls, checked_before(self.backend), seen_by)


class ReductionCheck(MismatchCheck):
    """The check by one MAX reduction per call on ``channel``: anything with torch's
    ``allreduce([int64 tensor], opts)`` returning a Work (a gloo ProcessGroup, ccl's channel)."""

    def __init__(self, channel: Any, members: Members, backend: str) -> None:
        super().__init__(members, backend)
        self.channel = channel
        self._max = torch_dist.AllreduceOptions()
        self._max.reduceOp = torch_dist.ReduceOp.MAX

    def verify(
        self, op: str, dtype: torch.dtype | None, count: int, root: int = -1, reduce_op: Any = None
    ) -> None:
        key = pack(op, dtype, root=root, reduce_op=reduce_op)
        values = torch.tensor((key, -key, count, -count), dtype=torch.int64)
        self._reduce(values, op)
        if not agree(key, count, values.tolist()):
            raise self.mismatch(op, self._gather(op, key, count))

    def verify_exchange(
        self, op: str, dtype: torch.dtype, sends: Sequence[int], receives: Sequence[int]
    ) -> None:
        # Entry (s, d) of an n x n grid is known to its sender s and its receiver d; each writes it
        # as [x, -x] (the others "unknown"), so after the MAX it holds its largest and (negated)
        # smallest value, equal exactly when the two ranks agree.
        key, size, me = pack(op, dtype), len(sends), self.members.group_rank
        grid = torch.full((size, size, 2), _UNKNOWN, dtype=torch.int64)
        sent, expected = torch.tensor(sends, dtype=torch.int64), torch.tensor(receives, dtype=torch.int64)
        grid[me, :, 0], grid[me, :, 1] = sent, -sent
        grid[:, me, 0] = torch.maximum(grid[:, me, 0], expected)
        grid[:, me, 1] = torch.maximum(grid[:, me, 1], -expected)
        values = torch.cat((torch.tensor((key, -key), dtype=torch.int64), grid.flatten()))
        self._reduce(values, op)
        if not agree(key, 0, [*values[:2].tolist(), 0, 0]):
            raise self.mismatch(op, self._gather(op, key, 0))
        grid = values[2:].view(size, size, 2)
        differing = (grid[:, :, 0] != -grid[:, :, 1]).nonzero()
        if len(differing):
            sender, receiver = differing[0].tolist()
            high, low = int(grid[sender, receiver, 0]), int(-grid[sender, receiver, 1])
            sent = self._gather_sends(op, sends)[sender][receiver]  # every rank found the same pair
            raise self.exchange_mismatch(op, dtype, sender, receiver, (sent, low if sent == high else high))

    def _gather(self, op: str, key: int, count: int) -> list[tuple[int, int]]:
        """Every rank's ``(key, count)``, by one more MAX reduction (every rank found the mismatch)."""
        size, me = len(self.members.ranks), self.members.group_rank
        values = torch.full((size, 2), _UNKNOWN, dtype=torch.int64)
        values[me, 0], values[me, 1] = key, count
        self._reduce(values, op)
        return [(int(row[0]), int(row[1])) for row in values]

    def _gather_sends(self, op: str, sends: Sequence[int]) -> list[list[int]]:
        """Every rank's ``sends``, by one more MAX reduction (every rank found the mismatch)."""
        size, me = len(self.members.ranks), self.members.group_rank
        values = torch.full((size, size), _UNKNOWN, dtype=torch.int64)
        values[me] = torch.tensor(sends, dtype=torch.int64)
        self._reduce(values, op)
        return values.tolist()

    def _reduce(self, values: torch.Tensor, op: str) -> None:
        """The check's MAX reduction, hidden from a running profiler: it is not the user's call.
        Its own failure (a dead peer, the group's timeout) propagates as the library raised it;
        the facade translates it, naming the op."""
        if not profiling.active:
            call_deadline.wait_polled(self.channel.allreduce([values], self._max), f"{op}'s signature check")
            return
        with profiling.hidden():
            call_deadline.wait_polled(self.channel.allreduce([values], self._max), f"{op}'s signature check")


class Speculation:
    """A call this rank entered before every peer had published its signature (a plain slotted
    class: one is built per speculated call)."""

    __slots__ = ("check", "count", "key", "op", "sequence")

    def __init__(self, check: SharedMemoryCheck, op: str, sequence: int, key: int, count: int) -> None:
        self.check, self.op, self.sequence, self.key, self.count = check, op, sequence, key, count

    def confirm(self) -> None:
        """Once the call returned: raise CollectiveMismatchError unless every rank passed this
        signature (every peer has published by then: the call needed all of them)."""
        self.check.confirm(self)


class SharedMemoryCheck(MismatchCheck):
    """The check through shared slots every rank of the group maps (one host); with ``replay``,
    blocking calls may speculate (see the module docstring)."""

    def __init__(
        self,
        signatures: SharedSignatures,
        members: Members,
        backend: str,
        limit: WaitLimit,
        replay: Replay | None = None,
    ) -> None:
        super().__init__(members, backend)
        self.signatures, self.limit, self.replay = signatures, limit, replay

    def verify(
        self, op: str, dtype: torch.dtype | None, count: int, root: int = -1, reduce_op: Any = None
    ) -> None:
        key = pack(op, dtype, root=root, reduce_op=reduce_op)
        sequence = self.signatures.publish(key, count)
        if self._gather(sequence, key, count, op) is not None:
            raise self._refused(op, sequence)

    def speculate(
        self, op: str, dtype: torch.dtype | None, count: int, root: int = -1, reduce_op: Any = None
    ) -> Speculation | None:
        if self.replay is None or count == 0:
            return super().speculate(op, dtype, count, root, reduce_op)
        key = pack(op, dtype, root=root, reduce_op=reduce_op)
        signatures = self.signatures
        sequence = signatures.publish(key, count)
        seen = signatures.peek(sequence, key, count)
        if seen is AGREED:
            return None
        if seen is PENDING:
            signatures.speculate(sequence)
            return Speculation(self, op, sequence, key, count)
        self._gather(sequence, key, count, op)  # every peer's call, for the message
        raise self._refused(op, sequence)

    def confirm(self, speculation: Speculation) -> None:
        """:meth:`Speculation.confirm`."""
        op, sequence, key, count = speculation.op, speculation.sequence, speculation.key, speculation.count
        if self.signatures.agreed(sequence, key, count):
            return
        if self._gather(sequence, key, count, op) is not None:
            raise self.mismatch(op, self.signatures.calls(sequence), after_call=True)

    def _refused(self, op: str, sequence: int) -> Exception:
        """The error of check ``sequence``, which found a mismatch; a peer that speculated on it
        first has its call completed by a scratch replay."""
        if self.replay is not None:
            speculated = self.signatures.refuse(sequence, op, self.limit, self.limit.group_timeout_s)
            if speculated is not None:
                with profiling.hidden():
                    self.replay(*speculated)
        return self.mismatch(op, self.signatures.calls(sequence))

    def verify_exchange(
        self, op: str, dtype: torch.dtype, sends: Sequence[int], receives: Sequence[int]
    ) -> None:
        key, signatures = pack(op, dtype), self.signatures
        sequence = signatures.publish_counts(key, sends, receives)
        if self._gather(sequence, key, 0, op) is not None:
            raise self._refused(op, sequence)
        counts = signatures.counts(sequence)
        for sender, (sent, _) in enumerate(counts):
            for receiver, (_, expected) in enumerate(counts):
                if sent[receiver] != expected[sender]:
                    pair = (sent[receiver], expected[sender])
                    raise self.exchange_mismatch(op, dtype, sender, receiver, pair)

    def _gather(self, sequence: int, key: int, count: int, op: str) -> Any:
        """The peers' signatures, waited for until the group's timeout, or the call's own deadline
        when it is sooner (then its expiry is the call's CommTimeoutError)."""
        deadline = call_deadline.current()
        if deadline is None or deadline - time.monotonic() >= self.limit.group_timeout_s:
            return self.signatures.gather(sequence, key, count, op, self.limit, self.limit.group_timeout_s)
        try:
            return self.signatures.gather(sequence, key, count, op, self.limit, deadline - time.monotonic())
        except CommTimeoutError:
            raise CommTimeoutError(
                f"{op}'s signature check did not complete within the call's timeout"
            ) from None


def group_check(spec: GroupSpec, channel: Any, backend: str, replay: Replay | None = None) -> MismatchCheck:
    """The default check of one group of ``backend``: through shared memory when every member is
    on this host (and the CPU orders plain stores), else by reduction on ``channel``. Collective
    over the members (they exchange hosts through the store): call it where they build the group.
    ``replay`` lets blocking calls speculate on one host (see the module docstring)."""
    members = Members.of(spec)
    signatures = host_signatures(spec, f"commlayer/{backend}/signatures/{spec.name}", os.environ)
    if signatures is None:
        return ReductionCheck(channel, members, backend)
    limit = WaitLimit(spec.timeout.total_seconds(), spec.global_rank, backend, group=spec.name)
    return SharedMemoryCheck(signatures, members, backend, limit, replay)


def split_counts(
    output: torch.Tensor, tensor: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int]
) -> tuple[list[int], list[int]]:
    """(elements sent to each rank, elements received from each) of an all_to_all_single; an
    empty split list is an even split of dim 0."""
    size = len(out_splits or in_splits)
    return _elements(tensor, in_splits, size), _elements(output, out_splits, size)


def _elements(tensor: torch.Tensor, splits: Sequence[int], size: int) -> list[int]:
    rows = tensor.shape[0] if tensor.dim() else 1
    row = tensor.numel() // rows if rows else 0
    return [split * row for split in splits] if splits else [tensor.numel() // size] * size
