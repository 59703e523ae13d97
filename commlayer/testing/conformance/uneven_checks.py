"""Conformance checks of the uneven collectives (``all_gather_v``, ``reduce_scatter_v`` and
``all_gather_into_tensor(..., sizes=...)``): every rank's part has its own size, one part is empty."""

from __future__ import annotations

from typing import Any

import torch

from commlayer import dist
from commlayer.core.types import ReduceOp
from commlayer.testing.conformance.case import Case
from commlayer.testing.conformance.values import DTYPES, assert_equal, ops_for, reduced, values

__all__ = ["CHECKS"]


def part_sizes(count: int) -> list[int]:
    """Element counts of a group's parts: all different where the group allows, the second empty."""
    return [0 if slot == 1 else 2 + (3 * slot) % 7 for slot in range(count)]


def check_all_gather_v(case: Case) -> None:
    sizes = part_sizes(len(case.members))
    own = sizes[case.group_rank] if case.is_member else 3
    for dtype in DTYPES:

        def listed(dtype: torch.dtype = dtype) -> None:
            outputs = [torch.zeros(size, dtype=dtype, device=case.device) for size in sizes]
            mine = case.tensor(case.me, dtype, numel=own)
            case.run(lambda a: dist.all_gather_v(outputs, mine, group=case.group, async_op=a))
            for slot, rank in enumerate(case.members if case.is_member else ()):
                expected = values(rank, dtype, numel=sizes[slot])
                assert_equal(outputs[slot].cpu(), expected, f"all_gather_v {dtype} slot {slot} {case.label}")

        case.attempt("all_gather_v", listed, dtype)

    def flat_strided() -> None:
        output = torch.zeros(2 * sum(sizes), device=case.device)[::2]
        mine = case.tensor(case.me, torch.float32, numel=own)
        case.run(
            lambda a: dist.all_gather_into_tensor(output, mine, group=case.group, async_op=a, sizes=sizes)
        )
        if case.is_member:
            expected = torch.cat(
                [values(rank, torch.float32, numel=n) for rank, n in zip(case.members, sizes)]
            )
            assert_equal(output.cpu(), expected, f"all_gather_into_tensor sizes= non-contiguous {case.label}")

    case.attempt("all_gather_v sizes= non-contiguous", flat_strided, torch.float32)


def check_reduce_scatter_v(case: Case) -> None:
    sizes = part_sizes(len(case.members))
    own = sizes[case.group_rank] if case.is_member else 3
    # Every dtype with SUM, every reduce op with float32: the padding path is dtype- and op-blind.
    cases = [(dtype, ReduceOp.SUM) for dtype in DTYPES if dtype is not torch.float32]
    for dtype, op in [*cases, *((torch.float32, op) for op in ops_for(torch.float32))]:
        chunks = [case.tensor(case.me, dtype, op, numel=n, salt=slot) for slot, n in enumerate(sizes)]

        def body(dtype: torch.dtype = dtype, op: ReduceOp = op, chunks: Any = chunks) -> None:
            output = torch.zeros(own, dtype=dtype, device=case.device)
            case.run(lambda a: dist.reduce_scatter_v(output, chunks, op=op, group=case.group, async_op=a))
            if case.is_member:
                expected = reduced(case.members, dtype, op, numel=own, salt=case.group_rank)
                assert_equal(output.cpu(), expected, f"reduce_scatter_v {dtype} {op.name} {case.label}", op)

        case.attempt("reduce_scatter_v", body, dtype, op)


CHECKS = (check_all_gather_v, check_reduce_scatter_v)
