"""Building a group's shared-memory segment through the store, over ranks that share a host
(:mod:`commlayer.core.hosts` finds them)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from typing import Any

from commlayer.backends.shm.native import load_extension
from commlayer.backends.shm.options import ShmOptions
from commlayer.core.types import GroupSpec

__all__ = ["build_comm"]


def build_comm(
    spec: GroupSpec, prefix: str, ranks: Sequence[int], pids: Sequence[int], options: ShmOptions
) -> Any:
    """The native communicator over group ranks ``ranks`` (all on this host); collective over them.

    The first of them creates the segment under a fresh random name; once every member has mapped
    it (and placed its own region's pages), every member unlinks the name, so the memory vanishes
    with the last mapping even if the job is killed.
    """
    native = load_extension()
    local_rank, size = ranks.index(spec.group_rank), len(ranks)
    region = native.region_bytes(options.small_bytes, options.chunk_bytes)
    store = spec.store
    if local_rank == 0:
        name = f"/commlayer-{os.getpid()}-{secrets.token_hex(8)}"
        mapping = native.Mapping(name, region * size, create=True)
        store.set(f"{prefix}/segment", name)
    else:
        name = store.get(f"{prefix}/segment").decode()
        mapping = native.Mapping(name, region * size, create=False)
    mapping.touch(region * local_rank, region)
    store.set(f"{prefix}/mapped/{local_rank}", "1")
    store.wait([f"{prefix}/mapped/{r}" for r in range(size)])
    native.unlink_segment(name)  # whichever member gets here first removes it; the rest find it gone
    return native.Comm(
        spec.name,
        [spec.ranks[r] for r in ranks],
        local_rank,
        size,
        mapping,
        [pids[r] for r in ranks],
        options.small_bytes,
        options.chunk_bytes,
        spec.timeout.total_seconds(),
        options.spins,
    )
