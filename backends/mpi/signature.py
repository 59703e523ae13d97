"""The default mismatch check of the mpi backend, plugged into :mod:`commlayer.contract.mismatch`.

MPI matches collectives by order only and never checks that ranks agree on what they pass: on
Intel MPI, rank 0 reducing 4 floats against rank 1's 8 returns garbage with exit code 0, and Open
MPI either aborts with a raw error or prints a wrong result first. So before each collective every
rank's signature (:mod:`commlayer.contract.mismatch.signature`) is compared, and every rank raises
the same CollectiveMismatchError before the real collective moves a byte. On a communicator whose
ranks all share one host the signatures meet in an MPI shared window
(:mod:`commlayer.contract.mismatch.shared_slots`, opened by :mod:`.shared_signatures`): a fraction
of a microsecond. Across hosts they meet in one 32-byte ``Allreduce(MAX)`` of
``[key, -key, count, -count]``, one more collective of latency (benchmarks/overhead/mismatch_checks.py).
There, the C fast path may also enter a call whose input MPI never writes before the late peers
have published (speculation); a peer that disagrees completes that call on scratch memory and
every rank still raises, inputs untouched (:meth:`SignatureCheck.speculated`, :mod:`.speculation`).

Vector all-to-alls pass a count of 0: their per-rank sizes differ legitimately.
Example: world of 2, rank 0 ``all_reduce(float32[4])``, rank 1 ``all_reduce(float32[8])``: both
raise "rank 0 called all_reduce(float32[4], op sum), peer rank 1 called all_reduce(float32[8],
op sum)" (each naming itself first).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from commlayer.backends.mpi.requests import wait_in_place
from commlayer.backends.mpi.speculation import scratch_replay
from commlayer.contract.mismatch.shared_slots import SharedSignatures
from commlayer.contract.mismatch.signature import (
    agree,
    checked_before,
    describe_key,
    dtype_codes,
    first_differing,
    mismatch_error,
    pack,
)
from commlayer.core.work import WaitLimit

__all__ = ["SignatureCheck", "verified_call"]

_CHECKED_BY = checked_before("mpi")
_SPECULATED = (
    "checked by mpi after this rank had entered its call, before every peer had published theirs: "
    "its input is untouched, its output undefined (COMMLAYER_DEBUG=detail checks before any rank enters)"
)
_UNKNOWN = -(1 << 62)  # below any key or count: a rank's row of the gathered calls not yet written
# Ordered mode's shared-memory wait raises at the group's timeout: the watchdog, which ends the job
# for a call stuck inside MPI, leaves a thread in this wait to raise its catchable error.
_ORDERED_DEADLINE_SHARE = 1.0


@dataclass(frozen=True)
class SignatureCheck:
    """Checks one communicator's calls; ``allreduce_max(values)`` reduces an int64 array in place.

    ``shared`` (ranks on one host): the exchange through shared memory that replaces the Allreduce.
    """

    allreduce_max: Callable[[array], Any]
    iallreduce_max: Callable[[array], Any]  # returns the request
    dtype_codes: dict[torch.dtype, int]
    group: str
    ranks: tuple[int, ...]  # global ranks by communicator rank
    comm_rank: int
    limit: WaitLimit | None = None  # set with ``shared``, whose waits it bounds
    shared: SharedSignatures | None = None
    # replay(key, count): a speculating peer's call, run here on scratch memory (see speculation.py)
    replay: Callable[[int, int], None] | None = None

    @classmethod
    def over(
        cls,
        comm: Any,
        mpi: Any,
        dtypes: Any,
        reductions: dict[Any, Any],
        limit: WaitLimit,
        ranks: tuple[int, ...],
        shared: SharedSignatures | None = None,
    ) -> SignatureCheck:
        """The check of ``comm``'s calls; ``dtypes`` and ``reductions`` are the backend's MPI
        datatypes and ops (those replay a speculating peer's call where ``shared`` is given);
        ``ranks`` are the communicator's global ranks, for messages."""
        int64, maximum, in_place = mpi.INT64_T, mpi.MAX, mpi.IN_PLACE
        allreduce, iallreduce = comm.Allreduce, comm.Iallreduce

        def allreduce_max(values: array) -> None:
            allreduce(in_place, [values, int64], maximum)

        def iallreduce_max(values: array) -> Any:
            return iallreduce(in_place, [values, int64], maximum)

        codes = dtype_codes(dtypes)
        replay = (
            None
            if shared is None
            else scratch_replay(comm, mpi.buffer.fromaddress, dtypes, reductions, codes)
        )
        group = limit.group or "?"
        return cls(allreduce_max, iallreduce_max, codes, group, ranks, comm.Get_rank(), limit, shared, replay)

    def key(self, op: str, tensor: torch.Tensor | None, root: int = -1, reduce_op: Any = None) -> int:
        return pack(op, None if tensor is None else tensor.dtype, self.dtype_codes, root, reduce_op)

    def verify(self, op: str, key: int, count: int) -> None:
        """Raise CollectiveMismatchError on every rank unless all ranks passed this key and count."""
        self.checked(op, key, _nothing)(count)

    def checked(self, op: str, key: int, call: Callable[..., Any]) -> Callable[..., None]:
        """``checked(count, *arguments)``: :meth:`verify` of ``op`` with ``key``, then
        ``call(*arguments)`` (what ordered mode's fast paths run, one frame for both)."""
        shared = self.shared
        if shared is None:

            def checked_by_allreduce(count: int, *arguments: Any) -> None:
                values = array("q", (key, -key, count, -count))
                self.allreduce_max(values)
                self._compare(op, key, count, values, None)
                call(*arguments)

            return checked_by_allreduce
        publish, settle = shared.publish, self._settle
        deadline_s = self.limit.group_timeout_s * _ORDERED_DEADLINE_SHARE

        def checked_in_shared_memory(count: int, *arguments: Any) -> None:
            settle(publish(key, count), op, key, count, deadline_s)
            call(*arguments)

        return checked_in_shared_memory

    def gathered(self, op: str, key: int, call: Callable[..., Any]) -> Callable[..., None]:
        """``gathered(sequence, count, *arguments)``: the check of a signature already published
        (``shared.publish(key, count)`` returned ``sequence``), then ``call(*arguments)``."""
        settle = self._settle
        deadline_s = self.limit.group_timeout_s * _ORDERED_DEADLINE_SHARE

        def checked_after_publishing(sequence: int, count: int, *arguments: Any) -> None:
            settle(sequence, op, key, count, deadline_s)
            call(*arguments)

        return checked_after_publishing

    def speculated(self, op: str, key: int) -> Callable[[int, int], None]:
        """``speculated(sequence, count)``: the check of a call this rank entered before every peer
        had published (the C fast path's speculation): waits for them, compares, and raises the
        mismatch, whose text says this rank's output is undefined."""
        gather, limit = self.shared.gather, self.limit
        deadline_s = limit.group_timeout_s * _ORDERED_DEADLINE_SHARE

        def compared_after_the_call(sequence: int, count: int) -> None:
            values = gather(sequence, key, count, op, limit, deadline_s)
            if values is not None:
                self._compare(op, key, count, values, sequence, _SPECULATED)

        return compared_after_the_call

    def verify_within(self, op: str, key: int, count: int, limit: WaitLimit) -> None:
        """:meth:`verify` through a request waited for until the group's timeout (modes whose
        synchronous ops are bounded)."""
        if self.shared is not None:
            self._settle(self.shared.publish(key, count), op, key, count, limit.group_timeout_s, limit)
            return
        values = array("q", (key, -key, count, -count))
        request = self.iallreduce_max(values)
        wait_in_place(request, op, limit, values)
        self._compare(op, key, count, values, None)

    def _settle(
        self, sequence: int, op: str, key: int, count: int, deadline_s: float, limit: WaitLimit | None = None
    ) -> None:
        """The shared-memory check of a published call this rank has not entered: returns when
        every rank agrees; else refuses, runs a speculating peer's call on scratch memory so that
        it completes, and raises the mismatch."""
        shared, limit = self.shared, limit or self.limit
        values = shared.gather(sequence, key, count, op, limit, deadline_s)
        if values is None:
            return
        speculated = shared.refuse(sequence, op, limit, deadline_s)
        if speculated is not None and self.replay is not None:
            self.replay(*speculated)
        self._compare(op, key, count, values, sequence)

    def _compare(
        self,
        op: str,
        key: int,
        count: int,
        values: Sequence[int],
        sequence: int | None,
        checked_by: str = _CHECKED_BY,
    ) -> None:
        """Raise the mismatch unless ``values`` (the group's extremes) say every rank agreed;
        ``sequence`` is the shared-memory check's, None where the Allreduce compared."""
        if agree(key, count, values):
            return
        calls = self.shared.calls(sequence) if sequence is not None else self._gather_calls(key, count)
        me = self.comm_rank
        peer = first_differing(calls[me], calls, me)
        mine, theirs = (describe_key(*calls[rank], self.dtype_codes) for rank in (me, peer))
        raise mismatch_error(op, self.group, ((self.ranks[me], mine), (self.ranks[peer], theirs)), checked_by)

    def _gather_calls(self, key: int, count: int) -> list[tuple[int, int]]:
        """Every rank's ``(key, count)`` by one more Allreduce (every rank found the mismatch)."""
        size = len(self.ranks)
        values = array("q", [_UNKNOWN] * (2 * size))
        values[2 * self.comm_rank], values[2 * self.comm_rank + 1] = key, count
        self.allreduce_max(values)
        return [(values[2 * rank], values[2 * rank + 1]) for rank in range(size)]


def _nothing() -> None:
    pass


def verified_call(
    verify: Callable[[str, int, int], None],
    op: str,
    signature: tuple[int, int],
    call: Callable[..., Any],
    *arguments: Any,
) -> None:
    """A checked blocking collective (ordered mode): the signature check, then ``call`` itself."""
    verify(op, *signature)
    call(*arguments)
