"""Making and unmaking groups: init_process_group, new_group, new_member_group and
destroy_process_group. The rank/size getters live in :mod:`commlayer.facade.groups.queries`."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

from commlayer.contract.backend import Backend
from commlayer.contract.registry import get_backend_class
from commlayer.contract.selection import (
    detect_accelerator,
    device_present,
    parse_backend_spec,
    resolve_backend_spec,
)
from commlayer.core import health, watchdog
from commlayer.core.boundary import user_facing
from commlayer.core.errors import AlreadyInitializedError, BackendUnavailableError, invalid_argument
from commlayer.core.job import agree_job_id
from commlayer.core.types import DEFAULT_TIMEOUT, GroupSpec
from commlayer.facade.calls.ignored_arguments import note_ignored
from commlayer.facade.calls.plans import forget_plans
from commlayer.facade.calls.recording import new_recorder
from commlayer.facade.groups.aborted import mark_destroyed
from commlayer.facade.groups.group import (
    NON_GROUP_MEMBER,
    ProcessGroup,
    World,
    current_world,
    groups_created,
    groups_released,
    set_world,
)
from commlayer.facade.groups.queries import is_initialized
from commlayer.facade.lifecycle.extensions import run_init_hooks
from commlayer.facade.lifecycle.init_method import Rendezvous, rendezvous
from commlayer.facade.lifecycle.signal_handlers import install_handlers
from commlayer.facade.monitor.dumps import dump_flight_recorder, dump_on_peer_failure, overdue_ops
from commlayer.facade.monitor.peer_monitor import start_monitor, stop_monitor
from commlayer.facade.monitor.progress import install as install_progress_answers

log = logging.getLogger("commlayer.dist")

# A peer that died is reported by its launcher; rank 0 need not wait for it for long.
_LEAVE_TIMEOUT = timedelta(seconds=60)

__all__ = [
    "destroy_process_group",
    "init_process_group",
    "new_group",
    "new_member_group",
]


@user_facing
def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Join the job and build the default group, exactly like ``torch.distributed``'s.

    ``backend=None`` picks from the accelerator (cuda -> ``"cpu:gloo,cuda:peermem"``, cpu ->
    ``"shm"``, or ``"gloo"`` where shm cannot run) unless ``$COMMLAYER_BACKEND`` names one.
    Backends are resolved before the rendezvous, so a missing one fails fast with the list of installed backends.
    """
    if is_initialized():
        world = current_world("init_process_group")
        raise AlreadyInitializedError(
            f"init_process_group: already initialized (rank {world.rank}); call "
            "destroy_process_group() before initializing again"
        )
    if device_id is not None:
        note_ignored("init_process_group", "device_id", device_id)
    if group_name:
        note_ignored("init_process_group", "group_name", group_name)
    spec = resolve_backend_spec(backend, os.environ, detect_accelerator(), _available)
    device_map = _device_map(spec)
    timeout = timeout or DEFAULT_TIMEOUT
    meeting = rendezvous(init_method, store, rank, world_size, timeout)
    world_backends = {
        name: _create_world_backend(name, meeting, timeout, pg_options)
        for name in sorted(set(device_map.values()))
    }
    default = ProcessGroup(
        "world",
        tuple(range(meeting.world_size)),
        meeting.rank,
        {device: world_backends[name] for device, name in device_map.items()},
        spec,
        timeout,
        new_recorder("world", tuple(range(meeting.world_size)), meeting.rank, timeout),
    )
    forget_plans()
    set_world(World(meeting.rank, meeting.world_size, meeting.store, timeout, default, world_backends))
    groups_created(default)
    agree_job_id(meeting.store, meeting.rank)  # every rank's dumps go into one folder
    watchdog.start(lambda why: dump_flight_recorder(reason=why), overdue_ops)
    health.add_listener(dump_on_peer_failure)
    install_handlers()
    install_progress_answers()
    start_monitor(
        meeting.store, meeting.rank, meeting.world_size, lambda why: dump_flight_recorder(reason=why)
    )
    run_init_hooks()  # e.g. the comms logger, when $COMMLAYER_COMMS_LOGGER enables it


@user_facing
def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Tear down one group, or (``group=None``) every group and the default one."""
    world = current_world("destroy_process_group")
    forget_plans()  # every plan was checked against groups that are going away
    if group is None or group is world.default_group:
        groups_released([*world.groups.values(), world.default_group])
        for member in list(world.groups.values()):
            member.forget_calls()
            mark_destroyed(member)
            _shutdown(member.unique_backends())
        world.default_group.forget_calls()
        stop_monitor(departing=True)
        _shutdown(reversed(list(world.world_backends.values())))
        _leave(world)
        _shutdown_retired(world)
        set_world(None)
        return
    if isinstance(group, ProcessGroup) and world.groups.pop(group.name, None) is not None:
        groups_released([group])
        group.forget_calls()
        mark_destroyed(group)
        _shutdown(group.unique_backends())


@user_facing
def new_group(
    ranks: Sequence[int] | None = None,
    timeout: timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
) -> ProcessGroup | object:
    """Create a group of ``ranks`` (global ranks). Every rank of the world must call it.

    World of 4, ``g = new_group([2, 0])``: ranks are sorted as in torch, so ``g.ranks == (0, 2)``;
    global rank 2 is group rank 1; ranks 1 and 3 get ``GroupMember.NON_GROUP_MEMBER``.
    """
    world = current_world("new_group")
    members = _check_group_ranks(world, ranks)
    if use_local_synchronization:
        note_ignored("new_group", "use_local_synchronization", use_local_synchronization)
    if group_desc is not None:
        note_ignored("new_group", "group_desc", group_desc)
    with world.lock:
        world.group_counter += 1
        name = f"group{world.group_counter}"
    spec = world.default_group.backend_spec if backend is None else str(backend).lower()
    device_map = _device_map(spec)
    timeout = timeout or world.timeout
    communicators = {
        backend_name: _world_backend(world, backend_name, pg_options).new_group(
            _group_spec(world, name, members, backend_name, timeout, pg_options)
        )
        for backend_name in sorted(set(device_map.values()))
    }
    if world.rank not in members:
        return NON_GROUP_MEMBER
    backends = {device: communicators[backend_name] for device, backend_name in device_map.items()}
    recorder = new_recorder(name, members, world.rank, timeout)
    created = ProcessGroup(name, members, world.rank, backends, spec, timeout, recorder)
    world.groups[name] = created
    groups_created(created)
    return created


def new_member_group(name: str, ranks: Sequence[int], store: Any, timeout: timedelta) -> ProcessGroup:
    """A group of ``ranks`` (global ranks, in group order) built by its members alone, on ``store``.

    torch's ``new_group`` asks only the members to build a group, where :func:`new_group` needs
    every rank of the world: each backend builds it from the members alone (``members_only``;
    torch groups underneath, such as shm's gloo companion, synchronise only the members too).
    Called on member ranks only.

    Raises:
        UnsupportedError: a backend of the world cannot build a group from its members alone.
    """
    world = current_world("new_group")
    spec = world.default_group.backend_spec
    device_map = _device_map(spec)
    members = tuple(ranks)
    communicators = {}
    for backend_name in sorted(set(device_map.values())):
        parent = world.world_backends[backend_name]
        group_spec = GroupSpec(name, members, world.rank, store, timeout, None, members_only=True)
        communicators[backend_name] = parent.new_group(group_spec)
    backends = {device: communicators[backend_name] for device, backend_name in device_map.items()}
    created = ProcessGroup(
        name, members, world.rank, backends, spec, timeout, new_recorder(name, members, world.rank, timeout)
    )
    world.groups[name] = created
    return created


def _available(name: str) -> bool:
    try:
        get_backend_class(name)
    except BackendUnavailableError:
        return False
    return True


def _device_map(spec: str) -> dict[str, str]:
    """Device type -> backend name of ``spec``, for the device types this host has.

    A spec of devices this host lacks only (``"nccl"`` without CUDA) keeps them, so that the
    missing backend is named.
    """
    devices_of = lambda name: sorted(get_backend_class(name).capabilities.devices)
    named = parse_backend_spec(spec, devices_of)
    device_map = {device: name for device, name in named.items() if device_present(device)} or named
    for name in set(device_map.values()):
        get_backend_class(name)  # fail before any rendezvous when a backend is missing
    return device_map


def _check_group_ranks(world: World, ranks: Sequence[int] | None) -> tuple[int, ...]:
    if ranks is None or len(ranks) == 0:
        return tuple(range(world.size))
    bad = [r for r in ranks if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < world.size]
    if bad or len(set(ranks)) != len(ranks):
        detail = invalid_argument(
            "new_group", "ranks", f"distinct ints in [0, {world.size})", list(ranks), world.rank
        )
        out_of_range = [r for r in bad if isinstance(r, int) and not isinstance(r, bool)]
        if out_of_range:  # torch's wording first
            raise type(detail)(
                f"Rank {out_of_range[0]} is out of range. Valid ranks are 0 to {world.size - 1} "
                f"(world_size={world.size}). {detail}"
            )
        raise detail
    return tuple(sorted(ranks))


def _group_spec(
    world: World, name: str, members: tuple[int, ...], backend_name: str, timeout: timedelta, options: Any
) -> GroupSpec:
    store = torch_dist.PrefixStore(f"commlayer/{backend_name}", world.store)
    return GroupSpec(name, members, world.rank, store, timeout, options)


def _create_world_backend(name: str, meeting: Rendezvous, timeout: timedelta, options: Any) -> Backend:
    store = torch_dist.PrefixStore(f"commlayer/{name}", meeting.store)
    spec = GroupSpec("world", tuple(range(meeting.world_size)), meeting.rank, store, timeout, options)
    return get_backend_class(name).create_world(spec)


def _world_backend(world: World, name: str, options: Any) -> Backend:
    """The world communicator of backend ``name``, built on first use (every rank is here)."""
    if name not in world.world_backends:
        meeting = Rendezvous(world.store, world.rank, world.size)
        world.world_backends[name] = _create_world_backend(name, meeting, world.timeout, options)
    return world.world_backends[name]


def _leave(world: World) -> None:
    """Keep the rendezvous store alive until every rank has left.

    Rank 0 usually hosts the store; if it exited first, a peer still reading its last message
    through the store (a store-based backend, or a torch backend's final exchange) would fail.
    """
    if world.size == 1:
        return
    if health.current() is not None:
        return  # a peer died: nobody will read through this store any more, and it may never leave
    world.store.set(f"commlayer/left/{world.rank}", b"1")
    if world.rank == 0:
        keys = [f"commlayer/left/{rank}" for rank in range(world.size)]
        try:
            world.store.wait(keys, min(world.timeout, _LEAVE_TIMEOUT))
        except Exception as error:  # noqa: BLE001 - a dead peer must not turn teardown into a crash
            log.warning("destroy_process_group: not every rank left within %s: %s", _LEAVE_TIMEOUT, error)


def _shutdown_retired(world: World) -> None:
    """The communicators of the world before shrink_group: their excluded ranks count as failed,
    so that no teardown waits for them."""
    if world.retired_backends:
        health.report(world.excluded_ranks[0], "left out of the world by shrink_group")
        _shutdown(world.retired_backends)


def _shutdown(backends: Iterable[Backend]) -> None:
    for backend in backends:
        backend.shutdown()
