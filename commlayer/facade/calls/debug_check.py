"""Debug mode's cross-rank check: every collective's fingerprint compared before it runs.

With ``COMMLAYER_DEBUG=detail`` or ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, each member of a group
publishes what it called under the collective's sequence number in the rendezvous store and waits
for the others. Example, rank 1 of 2 posting 8 elements where rank 0 posts 4, on rank 1::

    CollectiveMismatchError: all_reduce on group 'world': the ranks called different collectives:
    rank 1 called all_reduce(float32[8]), peer rank 0 called all_reduce(float32[4]); checked by
    debug mode at collective #3, before any data moved

(the message every backend's own check gives, :mod:`commlayer.contract.mismatch.signature`, with
shapes instead of element counts).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

from commlayer.contract.mismatch.signature import describe, mismatch_error
from commlayer.core import settings
from commlayer.core.errors import CommTimeoutError, describe_ranks
from commlayer.core.flight_recorder import DTYPE, OP, ROOT, SEQ, SHAPE
from commlayer.facade.groups.group import world_or_none

__all__ = ["DEBUG_ENV", "FingerprintCheck", "debug_mode", "describe_call"]

log = logging.getLogger("commlayer.dist")

DEBUG_ENV = settings.DEBUG.name
# All-to-all inputs may differ in shape between ranks (uneven splits): only op and dtype count.
_SHAPE_FREE_OPS = frozenset({"all_to_all", "all_to_all_single"})
_FINGERPRINT_PREFIX = "commlayer/fingerprint"


def debug_mode(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether collectives compare fingerprints across ranks before running.

    Also on after ``dist.set_debug_level(dist.DebugLevel.DETAIL)``, torch's debug-level API.
    """
    return (
        (settings.DEBUG.text(environ) or "").lower() == "detail"
        or environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL"
        or torch_dist.get_debug_level() == torch_dist.DebugLevel.DETAIL
    )


def describe_call(entry: list[Any]) -> str:
    """``reduce(float32[4, 2], root 1)``: what a rank called, as the mismatch error shows it."""
    shape = entry[SHAPE]
    dims = "; ".join(_dims(item) for item in shape) if isinstance(shape, list) else _dims(shape)
    return describe(entry[OP], entry[DTYPE], dims, root=entry[ROOT])


def _dims(shape: Any) -> str:
    return ", ".join(map(str, shape))


class FingerprintCheck:
    """Debug mode: every member publishes its call under the collective's sequence number, waits
    for all the others (bounded by the group timeout) and compares; costs a store round trip."""

    def __init__(self, group_name: str, ranks: tuple[int, ...], global_rank: int, timeout: timedelta) -> None:
        self.group_name = group_name
        self.ranks = ranks
        self.global_rank = global_rank
        self.timeout = timeout

    def __call__(self, entry: list[Any]) -> None:
        world = world_or_none()
        if world is None or len(self.ranks) == 1:
            return
        seq = entry[SEQ]
        call = describe_call(entry)
        mine = call if entry[OP] not in _SHAPE_FREE_OPS else describe(entry[OP], entry[DTYPE])
        prefix = f"{_FINGERPRINT_PREFIX}/{self.group_name}/{seq}/"
        store = world.store
        store.set(prefix + str(self.global_rank), mine)
        keys = [prefix + str(rank) for rank in self.ranks]
        self._wait(store, keys, seq, call)
        calls = dict(zip(self.ranks, (value.decode() for value in store.multi_get(keys))))
        self._forget(store, seq - 2)
        if len(set(calls.values())) > 1:
            peer = next(rank for rank, made in calls.items() if made != mine)
            checked_by = f"checked by debug mode at collective #{seq}, before any data moved"
            pair = ((self.global_rank, mine), (peer, calls[peer]))
            error = mismatch_error(entry[OP], self.group_name, pair, checked_by)
            error.calls = calls  # every rank's call, not only the pair the message names
            raise error

    def _wait(self, store: Any, keys: list[str], seq: int, call: str) -> None:
        try:
            store.wait(keys, self.timeout)
        except Exception as error:  # DistStoreError, or the store's host died
            missing = [rank for rank, key in zip(self.ranks, keys) if not _present(store, key)]
            raise CommTimeoutError(
                f"{call.split('(')[0]} #{seq} on group '{self.group_name}': {describe_ranks(missing)} "
                f"did not call collective #{seq} within {self.timeout}; this rank called {call} "
                f"(rank {self.global_rank})"
            ) from error

    def _forget(self, store: Any, seq: int) -> None:
        # Every member has read #seq once this rank passed #seq + 1: its key can go.
        if seq > 0:
            try:
                store.delete_key(f"{_FINGERPRINT_PREFIX}/{self.group_name}/{seq}/{self.global_rank}")
            except Exception as problem:  # noqa: BLE001 - a leftover key only costs store memory
                log.debug("commlayer: could not delete a fingerprint key: %s", problem)


def _present(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:  # noqa: BLE001
        return False
