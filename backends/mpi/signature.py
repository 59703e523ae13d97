"""The default mismatch check of the mpi backend: one 32-byte Allreduce before each collective.

MPI matches collectives by order only and never checks that ranks agree on what they pass: on
Intel MPI, rank 0 reducing 4 floats against rank 1's 8 returns garbage with exit code 0, and Open
MPI either aborts with a raw error or prints a wrong result first. So before each collective every
rank contributes its call's signature -- op, dtype, reduce op, root, element count -- packed into
two int64 values ``key`` and ``count``, as ``[key, -key, count, -count]`` to one in-place
``Allreduce(MAX)``. Afterwards each rank holds the group's maximum and (negated) minimum of both:
they are equal everywhere exactly when every rank made the same call, so every rank decides alike
and raises :class:`~commlayer.core.errors.CollectiveMismatchError` before the real collective moves a
byte. It is one more collective of latency (a few microseconds on one host:
benchmarks/overhead/mismatch_checks.py). On a communicator whose ranks all share one host, the
same four values come from a shared-memory exchange instead (:mod:`.shared_signatures`): each
rank publishes its signature in a cache line and reads its peers', a fraction of a microsecond
where the Allreduce is a round trip through the MPI library. There, the C launcher may also enter
a call whose input MPI never writes before the late peers have published (speculation); a peer
that disagrees completes that call on scratch memory and every rank still raises, inputs
untouched (:meth:`SignatureCheck.speculated`, :mod:`.speculation`).

Vector all-to-alls pass a count of 0: their per-rank sizes differ legitimately.
Example: world of 2, rank 0 ``all_reduce(float32[4])``, rank 1 ``all_reduce(float32[8])``: the
maximum count is 8, the minimum 4, and both ranks raise "element counts 4 to 8 across the group".
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from commlayer.backends.mismatch.signature import agree, describe, mismatch, pack
from commlayer.backends.mismatch.signature import dtype_codes as number_dtypes
from commlayer.backends.mpi.requests import wait_in_place
from commlayer.backends.mpi.shared_signatures import SharedSignatures
from commlayer.backends.mpi.speculation import scratch_replay
from commlayer.core.work import WaitLimit

__all__ = ["SignatureCheck", "describe", "verified_call"]

_CHECKED_BY = "Checked by the mpi backend before communicating; COMMLAYER_MPI_VERIFY=0 turns the check off."
_SPECULATED = (
    "Checked by the mpi backend after this rank's call, which it entered before every peer had "
    "published theirs: its input is untouched, its output undefined (COMMLAYER_DEBUG=detail checks "
    "before any rank enters; COMMLAYER_MPI_VERIFY=0 turns the check off)."
)
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
    rank: int
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
        shared: SharedSignatures | None = None,
    ) -> SignatureCheck:
        """The check of ``comm``'s calls; ``dtypes`` and ``reductions`` are the backend's MPI
        datatypes and ops (those replay a speculating peer's call where ``shared`` is given)."""
        int64, maximum, in_place = mpi.INT64_T, mpi.MAX, mpi.IN_PLACE
        allreduce, iallreduce = comm.Allreduce, comm.Iallreduce

        def allreduce_max(values: array) -> None:
            allreduce(in_place, [values, int64], maximum)

        def iallreduce_max(values: array) -> Any:
            return iallreduce(in_place, [values, int64], maximum)

        codes = number_dtypes(dtypes)
        replay = (
            None
            if shared is None
            else scratch_replay(comm, mpi.buffer.fromaddress, dtypes, reductions, codes)
        )
        return cls(
            allreduce_max, iallreduce_max, codes, limit.group or "?", limit.rank, limit, shared, replay
        )

    def key(self, op: str, tensor: torch.Tensor | None, root: int = -1, reduce_op: Any = None) -> int:
        return pack(op, None if tensor is None else tensor.dtype, self.dtype_codes, root, reduce_op)

    def verify(self, op: str, key: int, count: int) -> None:
        """Raise CollectiveMismatchError on every rank unless all ranks passed this key and count."""
        self.checked(op, key, _nothing)(count)

    def checked(self, op: str, key: int, call: Callable[..., Any]) -> Callable[..., None]:
        """``checked(count, *arguments)``: :meth:`verify` of ``op`` with ``key``, then
        ``call(*arguments)`` (what ordered mode's launchers run, one frame for both)."""
        shared = self.shared
        if shared is None:

            def checked_by_allreduce(count: int, *arguments: Any) -> None:
                values = array("q", (key, -key, count, -count))
                self.allreduce_max(values)
                self._compare(op, key, count, values)
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
        had published (the C launcher's speculation): waits for them, compares, and raises the
        mismatch, whose text says this rank's output is undefined."""
        gather, limit = self.shared.gather, self.limit
        deadline_s = limit.group_timeout_s * _ORDERED_DEADLINE_SHARE

        def compared_after_the_call(sequence: int, count: int) -> None:
            values = gather(sequence, key, count, op, limit, deadline_s)
            if values is not None:
                self._compare(op, key, count, values, _SPECULATED)

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
        self._compare(op, key, count, values)

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
        self._compare(op, key, count, values)

    def _compare(
        self, op: str, key: int, count: int, values: Sequence[int], checked_by: str = _CHECKED_BY
    ) -> None:
        if not agree(key, count, values):
            raise mismatch(op, key, count, values, self.dtype_codes, (self.group, self.rank), checked_by)


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
