"""The torch bridge, both ways: commlayer groups as torch ProcessGroups, and torch on commlayer.

* ``group.torch_group`` of a group whose backends are not torch's own (mpi, ccl, hccl, plugins) is
  a :class:`~commlayer.dist.torch_process_group.CommlayerProcessGroup` registered in torch's group tables,
  so DDP, FSDP2, DeviceMesh, DTensor, functional collectives and DCP accept it. The world group's
  bridge becomes torch's default group when torch has none; nothing is communicated.
* ``torch.distributed.init_process_group("commlayer")`` (the ``"commlayer"`` backend registered
  with ``Backend.register_backend``) runs an unmodified torch script on the backend commlayer's
  ``init_process_group(backend=None)`` would pick (``$COMMLAYER_BACKEND``, else the accelerator's).
  torch's ``new_group(ranks, backend="commlayer")`` (every mesh dimension of torch's
  ``init_device_mesh``) gets a commlayer group built by its members alone, on torch's store.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch.distributed as torch_dist
import torch.distributed.distributed_c10d as c10d

from commlayer.contract.registry import get_backend_class
from commlayer.contract.selection import detect_accelerator, parse_backend_spec, resolve_backend_spec
from commlayer.core.errors import UnsupportedError
from commlayer.facade.groups.group import (
    ProcessGroup,
    current_world,
    extend_groups,
    on_group_created,
    on_groups_released,
    world_or_none,
)
from commlayer.facade.lifecycle.process_groups import init_process_group, new_member_group
from commlayer.facade.torch_bridge.process_group import CommlayerProcessGroup
from commlayer.facade.torch_bridge.traceable import dynamo_loaded

__all__ = [
    "BACKEND_NAME",
    "after_group_created",
    "init_device_mesh",
    "register_with_torch",
    "release",
    "serves_itself",
    "torch_group_for",
]

BACKEND_NAME = "commlayer"
_DEVICES = ["cpu", "cuda"]


def register_with_torch() -> None:
    """Make ``"commlayer"`` a torch.distributed backend name (idempotent)."""
    if BACKEND_NAME.upper() not in torch_dist.Backend._plugins:
        torch_dist.Backend.register_backend(
            BACKEND_NAME, _create_from_torch, extended_api=True, devices=_DEVICES
        )


def torch_group_for(group: ProcessGroup) -> Any:
    """The torch ProcessGroup behind ``group``: torch's own for gloo/nccl, else the bridge.

    The first call for the world group may make the bridge torch's default group; the first call
    for any group registers it with torch. Both are local: no rank waits for another.
    """
    if group.bridge is None:
        world = current_world("torch_group")
        native = _native_torch_group(group)
        if native is not None:
            group.bridge = native
        elif group is world.default_group:
            group.bridge = _bridge_world(world.default_group, world)
        else:
            torch_group_for(world.default_group)  # torch needs its default group first
            group.bridge = _register(group, f"{BACKEND_NAME}:{group.group_name}", world)
    return group.bridge


def after_group_created(group: ProcessGroup) -> None:
    """Give a new group its torch ProcessGroup at once when torch.compile may trace it."""
    if dynamo_loaded():
        torch_group_for(group)


def release(groups: Sequence[ProcessGroup]) -> None:
    """Before commlayer tears ``groups`` down, unregister their bridges from torch."""
    bridged = [group.bridge for group in groups if isinstance(group.bridge, CommlayerProcessGroup)]
    for group in groups:
        group.bridge = None
    if not bridged or not torch_dist.is_initialized():
        return
    if isinstance(c10d._get_default_group(), CommlayerProcessGroup) and any(
        pg is torch_dist.group.WORLD for pg in bridged
    ):
        torch_dist.destroy_process_group()  # the bridge is torch's world: every torch group goes
        return
    for pg in bridged:
        if pg in c10d._world.pg_map:
            torch_dist.destroy_process_group(pg)


def init_device_mesh(
    device_type: str,
    mesh_shape: tuple[int, ...],
    *,
    mesh_dim_names: tuple[str, ...] | None = None,
    **kwargs: Any,
) -> torch_dist.DeviceMesh:
    """torch's ``init_device_mesh`` over commlayer's world (bridged first when it is not torch's)."""
    from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh

    torch_group_for(current_world("init_device_mesh").default_group)
    return torch_init_device_mesh(device_type, mesh_shape, mesh_dim_names=mesh_dim_names, **kwargs)


# --- commlayer -> torch -----------------------------------------------------------------------


def _native_torch_group(group: ProcessGroup) -> Any | None:
    """torch's own ProcessGroup when every backend of ``group`` is torch's own (gloo, nccl, hccl).

    A backend that merely stands on a torch group (shm's gloo companion for p2p, peermem's NCCL
    for the calls its kernels leave) gets the bridge, so that DDP's all-reduces run on the
    backend itself.
    """
    backends = group.unique_backends()
    if all(
        getattr(type(backend), "torch_backend", None) == backend.name and backend.torch_group is not None
        for backend in backends
    ):
        return group.primary_backend.torch_group
    return None


def _bridge_world(default: ProcessGroup, world: Any) -> Any:
    if torch_dist.is_initialized():  # torch's default group is another backend's (mixed specs)
        return _register(default, f"{BACKEND_NAME}:world", world)
    torch_dist.init_process_group(
        BACKEND_NAME,
        store=torch_dist.PrefixStore(f"{BACKEND_NAME}/bridge", world.store),
        rank=world.rank,
        world_size=world.size,
        timeout=world.timeout,
    )
    return torch_dist.group.WORLD


def _register(group: ProcessGroup, name: str, world: Any) -> CommlayerProcessGroup:
    pg = CommlayerProcessGroup(group, name)
    store = torch_dist.PrefixStore(f"{name}/", world.store)
    config = str(torch_dist.BackendConfig(BACKEND_NAME))
    ranks = {rank: index for index, rank in enumerate(group.ranks)}
    if hasattr(c10d, "_register_pg_in_world"):
        c10d._register_pg_in_world(
            pg,
            backend_name=BACKEND_NAME,
            store=store,
            group_name=name,
            backend_config=config,
            rank_mapping=ranks,
            add_to_default_tag=True,
        )
    else:
        _register_in_tables(pg, name, store, config, ranks)
    return pg


def _register_in_tables(pg: Any, name: str, store: Any, config: str, ranks: dict[int, int]) -> None:
    """What torch's ``_register_pg_in_world`` does, for the torch releases (2.11 and older) that
    fill the same tables without that helper."""
    tables, tag = c10d._world, f"ptd:{name}"
    tables.pg_map[pg] = (BACKEND_NAME, store)
    tables.pg_names[pg] = name
    tables.pg_backend_config[pg] = config
    c10d._register_process_group(name, pg)
    tables.pg_group_ranks[pg] = ranks
    tables.tags_to_pg.setdefault("", []).append(pg)
    tables.tags_to_pg.setdefault(tag, []).append(pg)
    tables.pg_to_tag[pg] = tag


# --- torch -> commlayer -----------------------------------------------------------------------


def _create_from_torch(options: Any, backend_options: Any) -> Any:
    """torch's creator for the ``"commlayer"`` backend: its default group, or one of its new_groups.

    torch calls it on the member ranks only, with a store of the group's own and the group's
    global ranks (none for the default group).
    """
    world = world_or_none()
    members = list(options.global_ranks_in_group)
    if world is None:
        return _start_world(options, members)
    if members:
        return _member_group(options, members)
    bridge = CommlayerProcessGroup(world.default_group, str(options.group_id))
    world.default_group.bridge = bridge
    return bridge


def _start_world(options: Any, members: list[int]) -> Any:
    """torch's default group on the backends commlayer picks: torch's gloo itself when gloo serves
    every device, else the bridge over a commlayer world (shm, peermem, mpi, nccl, plugins)."""
    spec = resolve_backend_spec(None, os.environ, detect_accelerator())
    if serves_itself(spec):
        return torch_dist.ProcessGroupGloo(
            options.store, options.group_rank, options.group_size, options.timeout
        )
    if members:
        raise UnsupportedError(
            f"new_group: the 'commlayer' backend has no world on rank {options.group_rank} to build "
            "groups from; start it with init_process_group('commlayer') first"
        )
    return _init_commlayer_world(spec, options)


def serves_itself(spec: str) -> bool:
    """Whether torch's own ProcessGroupGloo is the whole of backend string ``spec``.

    Any other selection gets the bridge over a commlayer world, also where torch has a backend of
    the same library underneath (peermem's NCCL, shm's gloo companion): there the ops must reach
    commlayer's backend, and torch knows none of those names.
    """
    devices_of = lambda name: sorted(get_backend_class(name).capabilities.devices)
    return set(parse_backend_spec(spec, devices_of).values()) == {"gloo"}


def _member_group(options: Any, members: list[int]) -> CommlayerProcessGroup:
    """torch's ``new_group(ranks, backend="commlayer")``: a commlayer group its members build alone.

    DeviceMesh builds every mesh dimension this way; torch destroys the group with the bridge.
    """
    name = str(options.group_id)
    if not name.isdigit():
        _refuse_hashed_name_over_torch_groups(options.group_rank)
    store = _fresh_store(options.store, len(members))
    group = new_member_group(f"torch:{name}", members, store, options.timeout)
    bridge = CommlayerProcessGroup(group, name)
    bridge.owns_group = True
    group.bridge = bridge
    return bridge


def _refuse_hashed_name_over_torch_groups(group_rank: int) -> None:
    """torch names a ``use_local_synchronization`` group by a hash of its ranks and its count of
    groups; a torch group built underneath it (shm's gloo companion) would get the very same name
    and collide in torch's registry, so such worlds refuse it up front."""
    world = current_world("new_group")
    over_torch = sorted(
        backend_name
        for backend_name, backend in world.world_backends.items()
        if backend.torch_group is not None
    )
    if over_torch:
        raise UnsupportedError(
            f"new_group: use_local_synchronization=True is not supported on backend '{over_torch[0]}' "
            f"(group rank {group_rank}, global rank {world.rank}), whose groups stand on torch groups; "
            "call new_group on every rank instead"
        )


def _init_commlayer_world(spec: str, options: Any) -> CommlayerProcessGroup:
    init_process_group(
        backend=spec,
        store=_fresh_store(options.store, options.group_size),
        rank=options.group_rank,
        world_size=options.group_size,
        timeout=options.timeout,
    )
    world = current_world("init_process_group")
    bridge = CommlayerProcessGroup(world.default_group, str(options.group_id))
    bridge.owns_world = True
    world.default_group.bridge = bridge
    return bridge


def _fresh_store(store: Any, members: int) -> Any:
    """``store`` under a prefix of its own for the group its ``members`` ranks are building.

    torch hands a group the same store prefix in every world of a process (its default group's,
    and its n-th new_group's), and one env:// store serves all those worlds (DeepSpeed run twice
    in one process), so the keys of an earlier world's group would still be there. Each member
    counts its arrival once per group, which puts the members of one group in one generation.
    """
    arrival = store.add(f"{BACKEND_NAME}/arrivals", 1)
    return torch_dist.PrefixStore(f"{BACKEND_NAME}/generation{(arrival - 1) // members}", store)


# Every commlayer group answers ``torch_group`` through this bridge, which follows their lives.
extend_groups("torch_group", torch_group_for)
on_group_created(after_group_created)
on_groups_released(release)
