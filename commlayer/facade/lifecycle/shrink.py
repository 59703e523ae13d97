"""shrink_group: a new group over the ranks of a group that remain, built by them alone.

Training goes on after a rank died: the survivors catch the PeerFailureError, call
``shrink_group([dead])`` and continue on the returned group. Each backend builds the new
communicator without the excluded ranks (:meth:`commlayer.contract.backend.Backend.shrink`), through a
fresh namespace of the rendezvous store. As in torch, shrinking the default group makes the
returned group the new default group with the survivors renumbered 0..n-1 (``get_rank()`` and
``get_world_size()`` answer for it) and destroys every other group; shrinking another group
leaves global ranks as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch.distributed as torch_dist

from commlayer.contract.backend import Backend
from commlayer.core.boundary import user_facing
from commlayer.core.errors import CommError, CommTimeoutError, InvalidArgumentError, InvalidTypeError
from commlayer.core.types import GroupSpec
from commlayer.facade.calls.plans import forget_plans
from commlayer.facade.calls.recording import new_recorder
from commlayer.facade.groups.aborted import abort_group, mark_destroyed
from commlayer.facade.groups.group import (
    ProcessGroup,
    World,
    current_world,
    groups_created,
    resolve_group,
    set_world,
)
from commlayer.facade.monitor.dumps import dump_flight_recorder
from commlayer.facade.monitor.peer_monitor import start_monitor, stop_monitor

__all__ = ["SHRINK_ABORT", "SHRINK_DEFAULT", "shrink_group"]

log = logging.getLogger("commlayer.dist")

SHRINK_DEFAULT: int = torch_dist.distributed_c10d.SHRINK_DEFAULT
SHRINK_ABORT: int = torch_dist.distributed_c10d.SHRINK_ABORT


@user_facing
def shrink_group(
    ranks_to_exclude: list[int],
    group: ProcessGroup | None = None,
    shrink_flags: int = SHRINK_DEFAULT,
    pg_options: Any | None = None,
) -> ProcessGroup:
    """Shrink a process group by excluding ranks, like ``torch.distributed.shrink_group``.

    Only the ranks that remain call it; the excluded ones (typically dead) take no part.

    Args:
        ranks_to_exclude (list[int]): ranks of ``group`` to leave out.
        group (ProcessGroup, optional): the group to shrink; None is the default group.
        shrink_flags (int): ``SHRINK_DEFAULT``, or ``SHRINK_ABORT`` (the old group is aborted
            either way here: its pending ops fail at once).
        pg_options (optional): backend options of the new group; by default the old group's.

    Returns:
        ProcessGroup: the new group over the remaining ranks. When the default group was shrunk,
        it is the new default group, with ranks renumbered 0..n-1, and every other group is
        destroyed.

    Raises:
        TypeError: ``ranks_to_exclude`` is not a list of ints.
        ValueError: it is empty, out of range, has duplicates or excludes every rank.
        CommError: this rank is excluded, or the backend failed to build the group
            (CommTimeoutError when a remaining rank did not join within the group's timeout;
            UnsupportedError when the backend cannot shrink, e.g. mpi after a death).

    Example::

        >>> try:
        ...     dist.all_reduce(grads)
        ... except dist.DistBackendError as failure:  # PeerFailureError
        ...     dist.shrink_group([failure.failed_rank])
        ...     dist.all_reduce(grads)  # on the survivors
    """
    world = current_world("shrink_group")
    target = resolve_group("shrink_group", group) or world.default_group
    excluded = _checked_exclusion(ranks_to_exclude, shrink_flags, target)
    survivors = tuple(rank for rank in range(target.size()) if rank not in excluded)
    forget_plans()  # every plan was checked against the group that goes away
    abort_group(target, CommError(f"group '{target.name}' was shrunk by shrink_group"))
    if target is world.default_group:
        return _shrink_world(world, survivors, pg_options)
    return _shrink_subgroup(world, target, survivors, pg_options)


def _checked_exclusion(ranks: Any, flags: Any, target: ProcessGroup) -> set[int]:
    rank = target.global_rank
    if not isinstance(ranks, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        raise InvalidTypeError(
            f"shrink_group: argument 'ranks_to_exclude' expected a list of ints, received {ranks!r} (rank {rank})"
        )
    if flags not in (SHRINK_DEFAULT, SHRINK_ABORT):
        raise InvalidArgumentError(
            f"shrink_group: argument 'shrink_flags' expected SHRINK_DEFAULT ({SHRINK_DEFAULT}) or "
            f"SHRINK_ABORT ({SHRINK_ABORT}), received {flags!r} (rank {rank})"
        )
    size = target.size()
    problem = (
        "an empty list"
        if not ranks
        else f"ranks out of range for a group of {size}"
        if any(not 0 <= r < size for r in ranks)
        else "duplicate ranks"
        if len(set(ranks)) != len(ranks)
        else "every rank of the group"
        if len(ranks) >= size
        else None
    )
    if problem is not None:
        raise InvalidArgumentError(
            f"shrink_group: argument 'ranks_to_exclude' expected distinct ranks of group "
            f"'{target.name}' leaving at least one, received {ranks} ({problem}) (rank {rank})"
        )
    if target.rank() in ranks:
        raise CommError(
            f"shrink_group: this rank (group rank {target.rank()}) is in ranks_to_exclude {ranks}; only the "
            f"remaining ranks call shrink_group (rank {rank})"
        )
    return set(ranks)


def _shrink_world(world: World, survivors: tuple[int, ...], pg_options: Any) -> ProcessGroup:
    """The survivors become a world of their own, renumbered, on a fresh store namespace."""
    generation = world.generation + 1
    prefix = f"commlayer/shrink{generation}/"
    store = torch_dist.PrefixStore(prefix, world.store)
    new_rank, new_size = survivors.index(world.rank), len(survivors)
    ranks = tuple(range(new_size))
    old = world.default_group
    for member in list(world.groups.values()):
        member.forget_calls()
        mark_destroyed(member)
        _release(member.unique_backends())
    communicators = {
        name: _shrunk(backend, survivors, GroupSpec("world", ranks, new_rank, store, old.timeout, pg_options))
        for name, backend in world.world_backends.items()
    }
    device_map = {device: old.backend_for(device) for device in old.device_types}
    names = {id(backend): name for name, backend in world.world_backends.items()}
    backends = {device: communicators[names[id(backend)]] for device, backend in device_map.items()}
    recorder = new_recorder("world", ranks, new_rank, old.timeout)
    default = ProcessGroup("world", ranks, new_rank, backends, old.backend_spec, old.timeout, recorder)
    retired = [*world.world_backends.values(), *world.retired_backends]
    excluded_globals = tuple(rank for rank in old.ranks if old.ranks.index(rank) not in survivors)
    stop_monitor(announce=False)
    set_world(
        World(
            new_rank,
            new_size,
            store,
            old.timeout,
            default,
            communicators,
            retired_backends=retired,
            generation=generation,
            excluded_ranks=(*world.excluded_ranks, *excluded_globals),
        )
    )
    groups_created(default)
    start_monitor(
        world.store, new_rank, new_size, lambda why: dump_flight_recorder(reason=why), prefix=prefix
    )
    return default


def _shrink_subgroup(
    world: World, target: ProcessGroup, survivors: tuple[int, ...], options: Any
) -> ProcessGroup:
    """A new group over the survivors; global ranks stay as they are."""
    with world.lock:
        world.group_counter += 1
        name = f"group{world.group_counter}"
    members = tuple(target.ranks[rank] for rank in survivors)
    spec = GroupSpec(name, members, world.rank, world.store, target.timeout, options)
    by_backend = {id(backend): _shrunk(backend, survivors, spec) for backend in target.unique_backends()}
    backends = {device: by_backend[id(target.backend_for(device))] for device in target.device_types}
    recorder = new_recorder(name, members, world.rank, target.timeout)
    created = ProcessGroup(name, members, world.rank, backends, target.backend_spec, target.timeout, recorder)
    if world.groups.pop(target.group_name, None) is not None:
        target.forget_calls()
        mark_destroyed(target)
    world.groups[name] = created
    groups_created(created)
    return created


def _shrunk(backend: Backend, survivors: tuple[int, ...], spec: GroupSpec) -> Backend:
    """``backend.shrink``, its failures typed: a survivor that never joins is a timeout."""
    try:
        return backend.shrink(survivors, spec)
    except CommError:
        raise
    except Exception as error:
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        kind = CommTimeoutError if "timeout" in text.lower() or "timed out" in text.lower() else CommError
        raise kind(
            f"shrink_group: the {backend.name} backend could not build the group of ranks {list(spec.ranks)} "
            f"within the timeout of {spec.timeout} (rank {spec.global_rank}): {type(error).__name__}: {text}"
        ) from error


def _release(backends: Sequence[Backend]) -> None:
    """Shut down the communicators of a destroyed group (a dead member must not stop the others)."""
    for backend in backends:
        try:
            backend.shutdown()
        except Exception as error:  # noqa: BLE001 - the group is gone either way
            log.debug("shrink_group: shutting down a %s communicator failed: %s", backend.name, error)
