"""Public pre- and post-hooks on every facade op, each handed a typed :class:`CollectiveCall`.

Hooks are registered process-wide (:func:`register_pre_hook`, re-exported by
:mod:`commlayer.hooks`) or on one group (``group.register_pre_hook(fn)``, which this module
gives every group); each registration
returns a :class:`RemovableHandle`. A pre-hook runs before the op is started and may raise to
refuse it; a post-hook runs once the op has completed (a blocking op before the call returns, an
async one when its Work is first seen complete by ``wait()`` or ``is_completed()``). Ops that a
hook issues itself (a content-hash hook gathers hashes) run without hooks.

How it stays free when unused: the hooks are one observer of
:mod:`commlayer.facade.calls.dispatch` (the "hooks" slot), installed only while at least one hook is registered; registering or removing a hook
drops every plan, so plans are built with the hook wrapper only while hooks exist, and only for
groups that have hooks (a process-wide hook counts for every group).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle as _TorchHandle

from commlayer.contract.fast_paths import FastPath
from commlayer.core.types import ReduceOp
from commlayer.core.work import Work
from commlayer.facade.calls import dispatch
from commlayer.facade.groups.group import ProcessGroup, extend_groups

__all__ = [
    "CollectiveCall",
    "PostHook",
    "PreHook",
    "RemovableHandle",
    "register_post_hook",
    "register_pre_hook",
]


@dataclass(frozen=True)
class CollectiveCall:
    """One facade op as hooks see it.

    Attributes:
        op (str): the facade op ("all_reduce", "send", "all_gather_into_tensor", ...).
        group (ProcessGroup): the group it runs on (``group.name``, ``group.ranks``, ...).
        rank (int): this process's global rank.
        tensors (tuple[Tensor, ...]): the call's tensors as the backend gets them.
        inputs (tuple[Tensor, ...]): what this rank contributes (empty on a broadcast's non-root
            ranks and for receives).
        dtype (torch.dtype | None): the element type of the inputs (None for tensorless ops).
        count (int): elements in ``inputs``; ``nbytes``: their size in bytes.
        root (int | None): the group rank of a rooted op's root, or of a p2p op's peer.
        reduce_op (ReduceOp | None): the reduction, for reducing ops.
        async_op (bool): whether the caller gets a Work back.
        seq (int): this call's number among the hooked calls of its group, from 0.
    """

    op: str
    group: ProcessGroup
    rank: int
    tensors: tuple[torch.Tensor, ...]
    inputs: tuple[torch.Tensor, ...]
    dtype: torch.dtype | None
    count: int
    nbytes: int
    root: int | None
    reduce_op: ReduceOp | None
    async_op: bool
    seq: int

    @property
    def group_name(self) -> str:
        return str(self.group.name)


PreHook = Callable[[CollectiveCall], None]
PostHook = Callable[[CollectiveCall], None]


class RemovableHandle(_TorchHandle):
    """torch's handle (``remove()``, a context manager); removing a hook also drops the plans."""

    def remove(self) -> None:
        super().remove()
        _refresh()


_PRE: OrderedDict[int, PreHook] = OrderedDict()
_POST: OrderedDict[int, PostHook] = OrderedDict()
# Every table a hook was registered in (process-wide, or a group's), weakly: id -> table.
_tables: dict[int, weakref.ref[OrderedDict[int, Any]]] = {}
_sequences: weakref.WeakKeyDictionary[ProcessGroup, Iterator[int]] = weakref.WeakKeyDictionary()
_inside = threading.local()  # ``active`` while this thread runs hooks: their own ops are not hooked

# Where a plan's run(async_op, *tensors) keeps this rank's contribution, per op.
_INPUT_AT = {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1, "all_to_all_single": 1, "recv": None}


def register_pre_hook(fn: PreHook, group: ProcessGroup | None = None) -> RemovableHandle:
    """Call ``fn(call)`` before every op (of ``group``; None: of every group) is started.

    Args:
        fn (Callable[[CollectiveCall], None]): the hook; an exception it raises refuses the op.
        group (ProcessGroup, optional): only this group's ops; None hooks every group.

    Returns:
        A :class:`RemovableHandle`: ``handle.remove()`` unregisters the hook.
    """
    return _register(fn, _PRE if group is None else _group_table(group, "pre_hooks"))


def register_post_hook(fn: PostHook, group: ProcessGroup | None = None) -> RemovableHandle:
    """Call ``fn(call)`` once every op (of ``group``; None: of every group) has completed.

    A blocking op's post-hooks run before the op returns; an async op's when its Work is first
    seen complete (``wait()``, ``is_completed()``). Arguments as :func:`register_pre_hook`.
    """
    return _register(fn, _POST if group is None else _group_table(group, "post_hooks"))


def _group_table(group: ProcessGroup, name: str) -> OrderedDict[int, Any]:
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"register_hook: argument 'group' expected a ProcessGroup, received {group!r}")
    return getattr(group, name)


def _register(fn: Callable[[CollectiveCall], None], table: OrderedDict[int, Any]) -> RemovableHandle:
    if not callable(fn):
        raise TypeError(f"register_hook: argument 'fn' expected a callable, received {fn!r}")
    handle = RemovableHandle(table)
    table[handle.id] = fn
    _tables[id(table)] = weakref.ref(table)
    _refresh()
    return handle


def _refresh() -> None:
    """Install the hooks' observer while any hook is registered, else none; drops every plan."""
    for key, ref in list(_tables.items()):
        if ref() is None:
            del _tables[key]
    active = any(len(ref() or ()) for ref in _tables.values())
    dispatch.set_observer(_OBSERVER if active else None, slot="hooks")


def _hooks_of(group: ProcessGroup) -> tuple[tuple[PreHook, ...], tuple[PostHook, ...]]:
    return (*_PRE.values(), *group.pre_hooks.values()), (*_POST.values(), *group.post_hooks.values())


def _next_seq(group: ProcessGroup) -> int:
    counter = _sequences.get(group)
    if counter is None:
        counter = _sequences[group] = itertools.count()
    return next(counter)


def _tensors(items: Any) -> tuple[torch.Tensor, ...]:
    if isinstance(items, torch.Tensor):
        return (items,)
    found: list[torch.Tensor] = []
    for item in items or ():
        found.extend(
            _tensors(item)
            if isinstance(item, (list, tuple))
            else [item]
            if isinstance(item, torch.Tensor)
            else []
        )
    return tuple(found)


def describe(
    call: dispatch.OpCall,
    tensors: Any,
    inputs: Any,
    root: int | None,
    reduce_op: Any,
    async_op: bool,
) -> CollectiveCall:
    """The :class:`CollectiveCall` of one op (``root``: a group rank, or None/-1 for none)."""
    contributed = _tensors(inputs)
    return CollectiveCall(
        op=call.op,
        group=call.group,
        rank=call.group.global_rank,
        tensors=_tensors(tensors),
        inputs=contributed,
        dtype=contributed[0].dtype if contributed else None,
        count=sum(tensor.numel() for tensor in contributed),
        nbytes=sum(tensor.numel() * tensor.element_size() for tensor in contributed),
        root=None if root is None or root < 0 else root,
        reduce_op=reduce_op if isinstance(reduce_op, ReduceOp) else None,
        async_op=async_op,
        seq=_next_seq(call.group),
    )


def _run_hooks(hooks: Sequence[Callable[[CollectiveCall], None]], record: CollectiveCall) -> None:
    _inside.active = True
    try:
        for hook in hooks:
            hook(record)
    finally:
        _inside.active = False


def _hooked(
    pre: Sequence[PreHook], post: Sequence[PostHook], record: CollectiveCall, start: Callable[[], Any]
) -> Any:
    """Run ``start`` between the hooks; its Work (or a blocking plan's None) is returned."""
    if pre:
        _run_hooks(pre, record)
    work = start()
    if not post:
        return work
    if work is None:  # a blocking plan: already complete
        _run_hooks(post, record)
        return None
    return work.then(lambda: _run_hooks(post, record))


class _HookObserver:
    """The dispatch observer that runs the registered hooks (see the module docstring)."""

    def observe(self, call: dispatch.OpCall, nbytes: int, start: Callable[[], Work], **details: Any) -> Work:
        pre, post = _hooks_of(call.group)
        if not (pre or post) or getattr(_inside, "active", False):
            return start()
        tensors = details.get("tensors", ())
        record = describe(
            call,
            tensors,
            details.get("inputs", tensors),
            details.get("root"),
            details.get("reduce_op"),
            bool(details.get("async_op", False)),
        )
        return _hooked(pre, post, record, start)

    def wrap_plan(
        self, call: dispatch.OpCall, run: FastPath, payload: int, fixed: tuple[Any, ...] = ()
    ) -> FastPath:
        pre, post = _hooks_of(call.group)
        if not (pre or post):
            return run  # registering a hook later drops this plan
        root, reduce_op = _scalars(call.op, fixed)
        at = _INPUT_AT.get(call.op, 0)

        def hooked_run(async_op: bool, *tensors: Any) -> Work | None:
            if getattr(_inside, "active", False):
                return run(async_op, *tensors)
            inputs = (
                () if at is None or (call.op == "broadcast" and root != call.group.rank()) else tensors[at]
            )
            record = describe(call, tensors, inputs, root, reduce_op, async_op)
            return _hooked(pre, post, record, lambda: run(async_op, *tensors))

        return hooked_run


def _scalars(op: str, fixed: tuple[Any, ...]) -> tuple[int | None, Any]:
    """A plan's (root or peer, reduce op) from its fixed arguments (see planned_collectives, p2p)."""
    if op in ("all_reduce", "reduce_scatter_tensor"):
        return None, fixed[0] if fixed else None
    if op in ("broadcast", "send", "recv"):
        return (fixed[0] if fixed else None), None
    return None, None


_OBSERVER = _HookObserver()
# group.register_pre_hook(fn) and group.register_post_hook(fn), on every group.
extend_groups("register_pre_hook", register_pre_hook)
extend_groups("register_post_hook", register_post_hook)
