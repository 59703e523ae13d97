"""Conformance checks of the public hooks and per-call ``timeout=``: hooks see each call's typed
arguments on the planned and the launched paths and nothing once removed; calls with a timeout
complete with exact results, sync and async, and a bad timeout is refused before communicating."""

from __future__ import annotations

from datetime import timedelta

import torch

from commlayer import dist, hooks
from commlayer.core.errors import InvalidArgumentError
from commlayer.core.types import ReduceOp
from commlayer.testing.conformance.case import Case
from commlayer.testing.conformance.values import NUMEL, assert_equal, reduced, values

__all__ = ["CHECKS"]


def check_hooks(case: Case) -> None:
    def hooked() -> None:
        pre: list[hooks.CollectiveCall] = []
        post: list[hooks.CollectiveCall] = []
        handles = (hooks.register_pre_hook(pre.append), hooks.register_post_hook(post.append))
        try:
            tensor = case.tensor(case.me, torch.float32)
            case.run(lambda a: dist.all_reduce(tensor, ReduceOp.SUM, group=case.group, async_op=a))
            outputs = [torch.zeros(NUMEL, device=case.device) for _ in case.members]
            mine = case.tensor(case.me, torch.float32)
            case.run(lambda a: dist.all_gather(outputs, mine, group=case.group, async_op=a))
        finally:
            for handle in handles:
                handle.remove()
        _check_calls(case, pre, post)
        if case.is_member:
            expected = reduced(case.members, torch.float32, ReduceOp.SUM)
            assert_equal(tensor.cpu(), expected, f"all_reduce with hooks {case.label}")
            for slot, rank in enumerate(case.members):
                assert_equal(
                    outputs[slot].cpu(), values(rank, torch.float32), f"all_gather with hooks {case.label}"
                )
        dist.all_reduce(case.tensor(case.me, torch.float32), group=case.group)
        assert len(pre) == (2 if case.is_member else 0), f"a removed hook still ran: {pre}"

    case.attempt("all_reduce/all_gather hooks", hooked, torch.float32, ReduceOp.SUM)


def _check_calls(case: Case, pre: list[hooks.CollectiveCall], post: list[hooks.CollectiveCall]) -> None:
    if not case.is_member:
        assert pre == [] and post == [], f"a non-member's hooks ran: {pre} {post}"
        return
    assert [call.op for call in pre] == ["all_reduce", "all_gather"], pre
    assert [call.op for call in post] == ["all_reduce", "all_gather"], post
    for call in pre:
        assert call.dtype == torch.float32 and call.count == NUMEL and call.nbytes == 4 * NUMEL, call
        assert list(call.group.ranks) == case.members and call.rank == case.me, call
        assert call.async_op == case.async_op, call
    assert pre[0].reduce_op == ReduceOp.SUM and pre[1].reduce_op is None, pre
    assert pre[1].seq == pre[0].seq + 1, pre


def check_call_timeouts(case: Case) -> None:
    def timed() -> None:
        tensor = case.tensor(case.me, torch.float32)
        case.run(lambda a: dist.all_reduce(tensor, group=case.group, async_op=a, timeout=60))
        root = case.members[-1]
        copied = case.tensor(case.me, torch.int64)
        case.run(
            lambda a: dist.broadcast(
                copied, src=root, group=case.group, async_op=a, timeout=timedelta(seconds=60)
            )
        )
        if case.is_member:
            expected = reduced(case.members, torch.float32, ReduceOp.SUM)
            assert_equal(tensor.cpu(), expected, f"all_reduce timeout= {case.label}")
            assert_equal(copied.cpu(), values(root, torch.int64), f"broadcast timeout= {case.label}")
        try:
            dist.all_reduce(tensor, group=case.group, async_op=case.async_op, timeout=-1)
        except InvalidArgumentError as error:
            assert "'timeout'" in str(error), error
        else:
            raise AssertionError("all_reduce accepted timeout=-1")

    case.attempt("all_reduce/broadcast timeout=", timed, torch.float32, ReduceOp.SUM)


CHECKS = (check_hooks, check_call_timeouts)
