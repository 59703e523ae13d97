"""Process groups as the facade sees them, and the world they belong to.

A :class:`ProcessGroup` is an ordered tuple of global ranks plus the backend communicator(s)
serving it, one per device type. Example, world of 4 on ``"cpu:gloo,cuda:nccl"``::

    g = dist.new_group([1, 3])
    # on global rank 3: g.ranks == (1, 3), g.rank() == 1, g.size() == 2, g.group_name == "group1",
    #                   g.backend_for("cpu") is a gloo communicator, g.backend_for("cuda") nccl
    # on global ranks 0 and 2: g is dist.GroupMember.NON_GROUP_MEMBER

It answers torch's ``ProcessGroup`` methods too: ``rank()``, ``size()``, ``name()`` (the backend),
``group_name``, ``monitored_barrier``, and every other one (``allreduce([t], opts)``, ...) through
its torch ProcessGroup, :attr:`ProcessGroup.torch_group`.
"""

from __future__ import annotations

import atexit
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.contract.backend import Backend
from commlayer.core.errors import InvalidArgumentError, NotInitializedError
from commlayer.core.flight_recorder import FlightRecorder, capacity_from_env

__all__ = [
    "GroupMember",
    "ProcessGroup",
    "World",
    "current_world",
    "extend_groups",
    "group",
    "groups_created",
    "groups_released",
    "on_group_created",
    "on_groups_released",
    "resolve_group",
]

# Accelerator backends serve barrier and the object collectives when a group has several.
_DEVICE_PREFERENCE = ("cuda", "xpu", "npu", "hpu", "cpu")


class _GroupName(str):
    """A group's name (``f"{g.name}" == "group1"``); called, it is torch's ``ProcessGroup.name()``.

    torch's ``pg.name()`` answers the backend (``"gloo"``), while commlayer code reads ``g.name`` as
    the group's name; one object serves both spellings.
    """

    backend: str

    def __new__(cls, name: str, backend: str) -> _GroupName:  # noqa: PYI034 - py3.10 has no typing.Self
        named = super().__new__(cls, name)
        named.backend = backend
        return named

    def __call__(self) -> str:
        return self.backend

    def __reduce__(self) -> tuple[type[str], tuple[str]]:
        return str, (str(self),)  # pickled (logger records, object collectives) as the plain name


class ProcessGroup:
    """A group of ranks and the communicator(s) of this process for it."""

    def __init__(
        self,
        name: str,
        ranks: tuple[int, ...],
        global_rank: int,
        backends: Mapping[str, Backend],
        backend_spec: str,
        timeout: timedelta,
        recorder: FlightRecorder | None = None,
    ) -> None:
        self.name = _GroupName(name, backend_spec)
        self.group_name = name
        self.group_desc = name
        self.ranks = ranks
        self.global_rank = global_rank
        self.backend_spec = backend_spec
        self.timeout = timeout
        self._backends = dict(backends)
        # (op, device) -> the OpCall that commlayer.dist.dispatch.begin resolved and checked for
        # it. Immutable entries over a fixed backend map: resolving once saves every later call
        # about 0.3 us. They refer back to this group, so teardown clears them (forget_calls).
        self.op_calls: dict[tuple[str, Any], Any] = {}
        # The torch ProcessGroup bridging this group, once torch_group built it (mpi, ccl, ...).
        self.bridge: Any = None
        # The last collectives on this group (commlayer.core.flight_recorder), filled as ops run.
        self.recorder = recorder or FlightRecorder(name, ranks, capacity_from_env())
        # This group's hooks (commlayer.facade.calls.hooks), by handle id.
        self.pre_hooks: OrderedDict[int, Any] = OrderedDict()
        self.post_hooks: OrderedDict[int, Any] = OrderedDict()

    def register_pre_hook(self, fn: Any) -> Any:
        """Call ``fn(call)`` before each op of this group; see :func:`commlayer.hooks.register_pre_hook`."""
        return _extension("register_pre_hook")(fn, group=self)

    def register_post_hook(self, fn: Any) -> Any:
        """Call ``fn(call)`` once each op of this group completed; see :func:`commlayer.hooks.register_post_hook`."""
        return _extension("register_post_hook")(fn, group=self)

    def forget_calls(self) -> None:
        """Break the group -> call -> group cycles, which only the garbage collector would free.

        Left to the collector, a torch ProcessGroup would be destroyed at an arbitrary point,
        possibly during interpreter shutdown, where gloo's worker threads abort the process.
        """
        self.op_calls.clear()

    def rank(self) -> int:
        return self.ranks.index(self.global_rank)

    def size(self) -> int:
        return len(self.ranks)

    @property
    def bound_device_id(self) -> None:
        return None

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        _extension("monitored_barrier")(self, timeout, wait_all_ranks)

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(self._backends)

    def backend_for(self, device_type: str) -> Backend | None:
        return self._backends.get(device_type)

    @property
    def primary_backend(self) -> Backend:
        for device_type in _DEVICE_PREFERENCE:
            if device_type in self._backends:
                return self._backends[device_type]
        return next(iter(self._backends.values()))

    def unique_backends(self) -> list[Backend]:
        return list({id(backend): backend for backend in self._backends.values()}.values())

    @property
    def torch_group(self) -> Any:
        """The torch ProcessGroup behind this group, for DDP/FSDP (``process_group=g.torch_group``).

        torch's own for gloo and nccl groups; for every other backend a torch ProcessGroup whose
        ops run on this group (see :mod:`commlayer.facade.torch_bridge.groups`).
        """
        return _extension("torch_group")(self)

    def __getattr__(self, name: str) -> Any:
        # torch ProcessGroup methods this class does not define (allreduce, _allgather_base, ...)
        # answer through the torch group; only names torch's class has, so typos still fail.
        if name in _TORCH_PROCESS_GROUP_NAMES:
            return getattr(self.torch_group, name)
        raise AttributeError(f"'ProcessGroup' object has no attribute '{name}'")

    def __repr__(self) -> str:
        return (
            f"ProcessGroup(name={self.group_name!r}, ranks={list(self.ranks)}, backend={self.backend_spec!r})"
        )


_TORCH_PROCESS_GROUP_NAMES = frozenset(
    name
    for name in dir(torch_dist.ProcessGroup)
    if not name.startswith("__") and name != "_pybind11_conduit_v1_"
)


class _NonGroupMember:
    """What new_group returns on ranks outside the group; ops on it do nothing, as in torch."""

    def __repr__(self) -> str:
        return "GroupMember.NON_GROUP_MEMBER"


NON_GROUP_MEMBER = _NonGroupMember()


# --- what the layers above give every group ----------------------------------------------------
# They sit above this module, which must not import them: each registers its part when imported
# (commlayer.dist imports the facade's; commlayer.hooks loads at init_process_group, as a
# dist extension). Name -> the function, called with the group first.
_PROVIDERS = {
    "torch_group": "commlayer.facade.torch_bridge",
    "monitored_barrier": "commlayer.facade.ops.monitored_barrier",
    "register_pre_hook": "commlayer.hooks",
    "register_post_hook": "commlayer.hooks",
}
_extensions: dict[str, Callable[..., Any]] = {}
# Called with each new group, and with the groups about to be torn down (the torch bridge's).
_created: list[Callable[[ProcessGroup], None]] = []
_released: list[Callable[[Sequence[ProcessGroup]], None]] = []


def extend_groups(name: str, function: Callable[..., Any]) -> None:
    """Serve ``ProcessGroup.<name>`` with ``function(group, ...)`` (one of ``_PROVIDERS``' names)."""
    if name not in _PROVIDERS:
        raise ValueError(f"extend_groups: no group extension named {name!r}; known: {sorted(_PROVIDERS)}")
    _extensions[name] = function


def _extension(name: str) -> Callable[..., Any]:
    function = _extensions.get(name)
    if function is None:
        raise NotImplementedError(
            f"ProcessGroup.{name} is provided by {_PROVIDERS[name]}, which is not imported; "
            "import commlayer.dist (and commlayer.hooks for hooks) first"
        )
    return function


def on_group_created(listener: Callable[[ProcessGroup], None]) -> None:
    """Call ``listener(group)`` with every group made from now on (idempotent)."""
    if listener not in _created:
        _created.append(listener)


def on_groups_released(listener: Callable[[Sequence[ProcessGroup]], None]) -> None:
    """Call ``listener(groups)`` before groups are torn down (idempotent)."""
    if listener not in _released:
        _released.append(listener)


def groups_created(group: ProcessGroup) -> None:
    """Tell the listeners that ``group`` was made (lifecycle calls it)."""
    for listener in tuple(_created):
        listener(group)


def groups_released(groups: Sequence[ProcessGroup]) -> None:
    """Tell the listeners that ``groups`` are about to be torn down (lifecycle calls it)."""
    for listener in tuple(_released):
        listener(groups)


@dataclass
class World:
    """State of the initialised job; replaced whole by init and dropped by destroy."""

    rank: int
    size: int
    store: Any
    timeout: timedelta
    default_group: ProcessGroup
    # Backend name -> its world communicator; new_group(backend=...) builds from these.
    world_backends: dict[str, Backend]
    groups: dict[str, ProcessGroup] = field(default_factory=dict)
    group_counter: int = 0
    # Communicators of the world this one was shrunk from: shut down with it, after its own.
    retired_backends: list[Backend] = field(default_factory=list)
    # How many times the world was shrunk: names the store namespace of the current one.
    generation: int = 0
    # Global ranks (of the first world) that shrink_group left out.
    excluded_ranks: tuple[int, ...] = ()
    lock: threading.Lock = field(default_factory=threading.Lock)


_world: World | None = None


def current_world(op: str) -> World:
    if _world is None:
        raise NotInitializedError(
            f"{op}: the default process group is not initialized; call "
            "commlayer.dist.init_process_group() first"
        )
    return _world


def _forget_calls_at_exit() -> None:
    if _world is not None:
        for member in (_world.default_group, *_world.groups.values()):
            member.forget_calls()


atexit.register(_forget_calls_at_exit)


def world_or_none() -> World | None:
    return _world


def set_world(world: World | None) -> None:
    global _world
    _world = world


class _GroupMeta(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:
        return None if _world is None else _world.default_group


class group(metaclass=_GroupMeta):
    """``dist.group.WORLD`` is the default group (None before init), as in torch."""


class GroupMember(metaclass=_GroupMeta):
    """torch's ``GroupMember``: ``GroupMember.WORLD`` is the default group, and
    ``GroupMember.NON_GROUP_MEMBER`` is what ``new_group`` returns on ranks outside the group.

    Example::

        >>> g = dist.new_group([0])
        >>> g is dist.GroupMember.NON_GROUP_MEMBER  # on rank 1
        True
    """

    NON_GROUP_MEMBER = NON_GROUP_MEMBER


def resolve_group(op: str, group_arg: Any) -> ProcessGroup | None:
    """The ProcessGroup meant by ``group_arg``; None when this rank is not a member."""
    world = current_world(op)
    if group_arg is None:
        return world.default_group
    if group_arg is NON_GROUP_MEMBER:
        return None
    if isinstance(group_arg, ProcessGroup):
        return group_arg if world.rank in group_arg.ranks else None
    bridged = _bridged_group(world, group_arg)
    if bridged is not None:
        return bridged if world.rank in bridged.ranks else None
    if isinstance(group_arg, torch_dist.ProcessGroup):
        raise InvalidArgumentError(
            f"{op}: argument 'group' expected a commlayer ProcessGroup, None, or a torch ProcessGroup "
            f"behind one (g.torch_group, torch's own group of a gloo/nccl group, or "
            f"new_group(backend='commlayer')), received a torch ProcessGroup that no commlayer group "
            f"uses (rank {world.rank})"
        )
    raise InvalidArgumentError(
        f"{op}: argument 'group' expected a commlayer ProcessGroup or None, received "
        f"{type(group_arg).__name__} (rank {world.rank})"
    )


def _bridged_group(world: World, torch_group: Any) -> ProcessGroup | None:
    """The commlayer group a torch ProcessGroup stands for: its bridge, the torch group one of its
    backends runs on (gloo, nccl), or the group a ``new_group(backend="commlayer")`` serves."""
    if not isinstance(torch_group, torch_dist.ProcessGroup):
        return None
    for member in (world.default_group, *world.groups.values()):
        if member.bridge is torch_group or any(
            backend.torch_group is torch_group for backend in member.unique_backends()
        ):
            return member
    try:
        served = torch_group._get_backend(torch.device("cpu"))
    except RuntimeError:  # no cpu backend in that group
        return None
    found = getattr(served, "commlayer_group", None)
    return found if isinstance(found, ProcessGroup) else None
