"""Building a oneCCL communicator over the rendezvous store, never blocking past the timeout.

The group's first rank creates a oneCCL *main KVS* (a small TCP key-value server inside oneCCL)
and publishes its address in the store; the other members read it and connect. The store is
the world's rendezvous store, so no second torch backend is needed. Example, world of 4 and
``new_group([1, 3])``::

    global rank 1 (group rank 0): create_main_kvs() -> store["group1/0/kvs_address"] = address
    global rank 3 (group rank 1): address = store["group1/0/kvs_address"] -> create_kvs(address)
    both: create_communicator(size=2, rank=<group rank>, kvs)
    global ranks 0 and 2: nothing (they are not members)

oneCCL itself waits forever for a peer that never connects, so each member first announces
itself in the store and waits for all the others there (a peer that never starts fails with the
missing ranks named), and the oneCCL calls then run on a helper thread bounded by what is left
of the timeout.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any, TypeVar

from commlayer.core.errors import CommError, CommTimeoutError
from commlayer.core.types import GroupSpec

__all__ = ["Connection", "GroupKeys", "connect", "disconnect"]

# Longest a KVS owner waits at shutdown for the other members to release their communicators.
SHUTDOWN_WAIT = timedelta(seconds=30)

T = TypeVar("T")

# What oneCCL's KVS address holds before its NUL padding: an IPv4/IPv6 address, "_", a port.
_ADDRESS = re.compile(rb"[0-9A-Fa-f.:]+_[0-9]{1,5}")

# How often this process built a group of a given name: keys stay fresh when a store outlives a
# destroy_process_group / init_process_group cycle (every rank counts the same way).
_generations: Counter[str] = Counter()
_generations_lock = threading.Lock()


@dataclass(frozen=True)
class GroupKeys:
    """The store keys of one group incarnation."""

    prefix: str

    @classmethod
    def next_for(cls, group_name: str) -> GroupKeys:
        with _generations_lock:
            _generations[group_name] += 1
            return cls(f"{group_name}/{_generations[group_name]}")

    @property
    def address(self) -> str:
        return f"{self.prefix}/kvs_address"

    def joined(self, group_rank: int) -> str:
        return f"{self.prefix}/joined/{group_rank}"

    def closed(self, group_rank: int) -> str:
        return f"{self.prefix}/closed/{group_rank}"

    @property
    def released(self) -> str:
        return f"{self.prefix}/released"


@dataclass
class Connection:
    """Owns a oneCCL communicator and the KVS it was built from (which must outlive it)."""

    communicator: Any
    kvs: Any
    address: str
    keys: GroupKeys

    def release(self) -> None:
        # This object is the only owner, so oneCCL's destructors run here, communicator first.
        self.communicator = None
        self.kvs = None

    def abandon(self) -> None:
        """Leak both objects when released: their teardown would need a peer that may be gone."""
        self.communicator.abandon()
        self.kvs.abandon()


class _Deadline:
    def __init__(self, timeout: timedelta) -> None:
        self._end = time.monotonic() + timeout.total_seconds()

    def remaining(self) -> timedelta:
        return timedelta(seconds=max(0.0, self._end - time.monotonic()))


def connect(spec: GroupSpec, native: ModuleType) -> Connection:
    """Build this member's communicator for ``spec``; called by every member of the group."""
    keys = GroupKeys.next_for(spec.name)
    deadline = _Deadline(spec.timeout)
    _wait_for_members(spec, keys, deadline)
    if spec.group_rank == 0:
        kvs = native.create_main_kvs()
        address = kvs.address()
        spec.store.set(keys.address, address)
        make_kvs: Callable[[], Any] = lambda: kvs
    else:
        address = _read_address(spec, keys, deadline, native.ADDRESS_SIZE)
        make_kvs = lambda: _open_kvs(spec, native, address)

    def build() -> Connection:
        kvs = make_kvs()
        try:
            communicator = native.create_communicator(spec.size, spec.group_rank, kvs)
        except RuntimeError as error:
            raise CommError(
                f"ccl: group '{spec.name}': creating the oneCCL communicator over the KVS at "
                f"'{printable(address)}' failed (rank {spec.global_rank}): {error}"
            ) from error
        return Connection(communicator, kvs, printable(address), keys)

    return _run_before(deadline, spec, build, f"over the KVS at '{printable(address)}'")


def disconnect(spec: GroupSpec, connection: Connection) -> None:
    """Release ``connection`` in the only order oneCCL 2021.14 survives.

    Destroying a communicator talks to the KVS server living in group rank 0's process; if that
    process has already dropped it, oneCCL aborts the process. So the other members release
    theirs first and say so in the store; rank 0 waits for that (bounded), then releases its own
    communicator and the server. A member that finds the server gone, or cannot reach the store,
    leaks its objects instead: the process is ending anyway.
    """
    keys = connection.keys
    if spec.group_rank == 0:
        others = [keys.closed(rank) for rank in range(1, spec.size)]
        if others:
            _quietly(lambda: spec.store.wait(others, min(spec.timeout, SHUTDOWN_WAIT)))
        _quietly(lambda: spec.store.set(keys.released, b"1"))
        connection.release()
        return
    if not _quietly(lambda: not spec.store.check([keys.released])):
        connection.abandon()
    connection.release()
    _quietly(lambda: spec.store.set(keys.closed(spec.group_rank), b"1"))


def _quietly(step: Callable[[], Any]) -> bool:
    """Run a store step during shutdown; False if it failed or returned something false."""
    try:
        result = step()
    except RuntimeError:
        return False
    return result is None or bool(result)


def printable(address: bytes) -> str:
    """oneCCL's address is ``ip_port`` padded with NUL bytes to 256."""
    return address.split(b"\0", 1)[0].decode("ascii", errors="replace")


def _wait_for_members(spec: GroupSpec, keys: GroupKeys, deadline: _Deadline) -> None:
    spec.store.set(keys.joined(spec.group_rank), b"1")
    everyone = [keys.joined(rank) for rank in range(spec.size)]
    try:
        spec.store.wait(everyone, deadline.remaining())
    except RuntimeError as error:  # DistStoreError: the store's own timeout
        missing = [rank for rank, key in enumerate(everyone) if not spec.store.check([key])]
        if not missing:
            raise
        raise CommTimeoutError(
            f"ccl: group '{spec.name}': group ranks {missing} (global ranks "
            f"{[spec.ranks[rank] for rank in missing]}) did not join within {spec.timeout} "
            f"(rank {spec.global_rank}); check that every rank runs and creates this group"
        ) from error


def _read_address(spec: GroupSpec, keys: GroupKeys, deadline: _Deadline, size: int) -> bytes:
    try:
        spec.store.wait([keys.address], deadline.remaining())
    except RuntimeError as error:
        raise CommTimeoutError(
            f"ccl: group '{spec.name}': group rank 0 (global rank {spec.ranks[0]}) did not "
            f"publish its oneCCL KVS address within {spec.timeout} (rank {spec.global_rank})"
        ) from error
    address = spec.store.get(keys.address)
    if len(address) != size or not _ADDRESS.fullmatch(address.rstrip(b"\0")):
        raise CommError(
            f"ccl: group '{spec.name}': store key '{keys.address}' expected a oneCCL KVS address "
            f"('<ip>_<port>' padded with NUL bytes to {size}), received {len(address)} bytes "
            f"{address[:40]!r} (rank {spec.global_rank})"
        )
    return address


def _open_kvs(spec: GroupSpec, native: ModuleType, address: bytes) -> Any:
    try:
        return native.create_kvs(address)
    except RuntimeError as error:
        raise CommError(
            f"ccl: group '{spec.name}': cannot connect to the oneCCL KVS at '{printable(address)}' "
            f"published by global rank {spec.ranks[0]} (rank {spec.global_rank}): {error}"
        ) from error


def _run_before(deadline: _Deadline, spec: GroupSpec, build: Callable[[], T], over: str) -> T:
    """Run ``build`` on a daemon thread; give up (leaving it blocked in oneCCL) at the deadline."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = build()
        except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=target, name=f"commlayer-ccl-connect-{spec.name}", daemon=True)
    worker.start()
    worker.join(deadline.remaining().total_seconds())
    if worker.is_alive():
        raise CommTimeoutError(
            f"ccl: group '{spec.name}': building the oneCCL communicator {over} (published by "
            f"global rank {spec.ranks[0]}) did not finish within {spec.timeout} (rank "
            f"{spec.global_rank}); the address may be unreachable or a peer died while connecting"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
