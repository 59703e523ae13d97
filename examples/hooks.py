"""Hooks: functions that see every call's typed arguments, before it is launched or once it is done.

A pre-hook on every group prints each call; a post-hook on one group counts that group's calls
only. Handles remove them again.

Run: commlayer run -n 2 examples/hooks.py
"""

from __future__ import annotations

import torch

from commlayer import dist, hooks

dist.init_process_group()
tp_group = dist.new_group([0, 1])
seen: list[str] = []


def my_post_hook(call: hooks.CollectiveCall) -> None:
    seen.append(call.op)


handle = hooks.register_pre_hook(lambda call: print(call.op, call.group_name, call.count))
tp_handle = tp_group.register_post_hook(my_post_hook)  # one group's calls only
dist.all_reduce(torch.ones(4))  # the world's: printed, not counted
dist.broadcast(torch.ones(2), src=0, group=tp_group)  # printed and counted
handle.remove()
tp_handle.remove()
dist.all_reduce(torch.ones(4), group=tp_group)  # neither

assert seen == ["broadcast"], seen
dist.destroy_process_group()
