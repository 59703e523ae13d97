"""Public hooks on every collective and p2p call of ``commlayer.dist``.

Register a function that sees each call's typed arguments before it is started (a pre-hook,
which may refuse it by raising) or once it has completed (a post-hook)::

    from commlayer import dist, hooks

    def show(call: hooks.CollectiveCall) -> None:
        print(call.op, call.group_name, call.dtype, call.count, call.root, call.reduce_op, call.seq)

    handle = hooks.register_pre_hook(show)          # every group
    tp_handle = tp_group.register_pre_hook(show)    # one group
    ...
    handle.remove()

Shipped hooks, built on the same registration:

- :func:`comms_logger` turns the comms logger on (``handle.remove()`` turns it off);
- :func:`flight_recorder` records the hooked calls in a flight recorder of its own;
- :func:`content_hash` hashes every call's inputs and compares the hashes across a group whose
  ranks must agree (e.g. a mesh's data-parallel replicas fed the same batch), naming the rank
  whose data diverges.

With no hook registered the facade's paths carry no hook code at all (see
:mod:`commlayer.hooks.registry`).
"""

from __future__ import annotations

from commlayer.hooks.content_hash import ContentDivergenceError, ContentHashHook, content_hash
from commlayer.hooks.registry import (
    CollectiveCall,
    PostHook,
    PreHook,
    RemovableHandle,
    register_post_hook,
    register_pre_hook,
)
from commlayer.hooks.shipped import LoggerHandle, RecorderHook, comms_logger, flight_recorder

__all__ = [
    "CollectiveCall",
    "ContentDivergenceError",
    "ContentHashHook",
    "LoggerHandle",
    "PostHook",
    "PreHook",
    "RecorderHook",
    "RemovableHandle",
    "comms_logger",
    "content_hash",
    "flight_recorder",
    "register_post_hook",
    "register_pre_hook",
]
