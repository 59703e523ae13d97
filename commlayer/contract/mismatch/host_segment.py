"""Shared signature slots in /dev/shm for a group whose ranks all share this host (gloo, ccl).

The group's first rank creates a segment under a fresh random name and publishes the name in
the store; once every member has mapped it, every member unlinks the name, so the memory vanishes
with the last mapping even if the job is killed. Slots are wide enough for an exchange's
per-peer counts (:meth:`~.shared_slots.SharedSignatures.publish_counts`), rounded to whole cache
lines.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
from collections.abc import Mapping

from commlayer.contract.mismatch.shared_slots import (
    NO_HOOKS,
    WORDS,
    SharedSignatures,
    WaitHooks,
    shared_memory_is_ordered,
)
from commlayer.core.hosts import exchange_hosts
from commlayer.core.types import GroupSpec

__all__ = ["host_signatures", "slot_words"]

_SHARED_MEMORY = "/dev/shm"
_LINE_WORDS = 8  # int64 words per 64-byte cache line


def slot_words(size: int) -> int:
    """Words of one slot for a group of ``size``: the signature line, then sends and receives."""
    words = WORDS + 2 * size
    return -(-words // _LINE_WORDS) * _LINE_WORDS


def host_signatures(
    spec: GroupSpec, prefix: str, environ: Mapping[str, str], hooks: WaitHooks = NO_HOOKS
) -> SharedSignatures | None:
    """The group's slots in one /dev/shm segment, or None when its members span hosts or this CPU
    does not order plain stores (then every member gets None). Collective over the members."""
    hosts = exchange_hosts(spec, prefix, environ)
    if not hosts.single_host or not shared_memory_is_ordered() or not os.path.isdir(_SHARED_MEMORY):
        return None
    slot_bytes = 2 * slot_words(spec.size) * 8
    mapping = _map_segment(spec, prefix, slot_bytes * spec.size)
    whole = memoryview(mapping)
    slots = [whole[rank * slot_bytes : (rank + 1) * slot_bytes].cast("q") for rank in range(spec.size)]
    return SharedSignatures(slots, spec.group_rank, hooks=hooks)


def _map_segment(spec: GroupSpec, prefix: str, size: int) -> mmap.mmap:
    """The segment, mapped (zero-filled by the kernel); its name is gone once every member mapped it."""
    store = spec.store
    if spec.group_rank == 0:
        name = f"{_SHARED_MEMORY}/commlayer-signatures-{os.getpid()}-{secrets.token_hex(8)}"
        descriptor = os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(descriptor, size)
        store.set(f"{prefix}/segment", name)
    else:
        name = store.get(f"{prefix}/segment").decode()
        descriptor = os.open(name, os.O_RDWR)
    try:
        mapping = mmap.mmap(descriptor, size)
    finally:
        os.close(descriptor)
    store.set(f"{prefix}/mapped/{spec.group_rank}", "1")
    store.wait([f"{prefix}/mapped/{rank}" for rank in range(spec.size)])
    with contextlib.suppress(FileNotFoundError):  # whichever member gets here first removes it
        os.unlink(name)
    return mapping
