"""The compatibility suite: every facade op, dtype and ReduceOp, on WORLD and a subgroup, sync and
async, with exact checks. One world runs all of it (spawning per case would not fit in CI).

Run by the harness on any backend::

    run_world("tests.ranks.compat:main", world_size=3, backend="gloo")

Layout used throughout (world of 4): the subgroup is global ranks [1, 2, 3], so global rank 0 is
the non-member that must get None back and keep its tensors; world of 2 uses [0, 1] in a new
group, so group translation is still exercised.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from commlayer import dist
from commlayer.errors import UnsupportedError
from commlayer.types import ReduceOp

from ._values import DTYPES, NUMEL, assert_equal, ops_for, reduced, values


@dataclass(frozen=True)
class Case:
    """One pass of the suite: a group, a mode, and what the backend supports."""

    group: Any  # None (WORLD) or a ProcessGroup / NON_GROUP_MEMBER
    members: list[int]  # global ranks, in group order
    me: int  # global rank
    async_op: bool
    device: torch.device
    dtypes: frozenset
    reduce_ops: frozenset

    @property
    def is_member(self) -> bool:
        return self.me in self.members

    @property
    def group_rank(self) -> int:
        return self.members.index(self.me)

    @property
    def label(self) -> str:
        return f"group={self.members} async={self.async_op}"

    def run(self, launch: Callable[[bool], Any]) -> None:
        """Launch with this case's async_op, check the handle, and wait for it."""
        work = launch(self.async_op)
        if not self.is_member or not self.async_op:
            assert work is None, f"{self.label}: expected None, got {work!r}"
            return
        assert work.wait() is True and work.is_completed(), f"{self.label}: work not completed"

    def tensor(
        self, rank: int, dtype: torch.dtype, op: ReduceOp = ReduceOp.SUM, numel: int = NUMEL, salt: int = 0
    ) -> torch.Tensor:
        return values(rank, dtype, op, numel, salt).to(self.device)


def main() -> None:
    world, me = dist.get_world_size(), dist.get_rank()
    backend = dist.group.WORLD.primary_backend
    device = _device(backend.capabilities.devices)
    sub_ranks = list(range(1, world)) if world > 2 else list(range(world))
    subgroup = dist.new_group(sub_ranks)
    for group, members in ((None, list(range(world))), (subgroup, sub_ranks)):
        for async_op in (False, True):
            case = Case(
                group,
                members,
                me,
                async_op,
                device,
                backend.capabilities.dtypes,
                backend.capabilities.reduce_ops,
            )
            for check in CHECKS:
                check(case)
    check_unsupported_combinations(backend, device)
    dist.barrier()


# --- reductions --------------------------------------------------------------------------------


def check_all_reduce(case: Case) -> None:
    for dtype, op in _dtype_ops(case):
        tensor = case.tensor(case.me, dtype, op)
        case.run(lambda a: dist.all_reduce(tensor, op=op, group=case.group, async_op=a))
        expected = reduced(case.members, dtype, op) if case.is_member else values(case.me, dtype, op)
        assert_equal(tensor.cpu(), expected, f"all_reduce {dtype} {op.name} {case.label}", op)


def check_all_reduce_large_and_strided(case: Case) -> None:
    """A 1 MiB buffer (libraries chunk those) and a non-contiguous view (torch 2.13 gloo bug)."""
    big = case.tensor(case.me, torch.float32, numel=1 << 18)
    case.run(lambda a: dist.all_reduce(big, group=case.group, async_op=a))
    expected = (
        reduced(case.members, torch.float32, ReduceOp.SUM, numel=1 << 18)
        if case.is_member
        else values(case.me, torch.float32, numel=1 << 18)
    )
    assert_equal(big.cpu(), expected, f"all_reduce 1MiB {case.label}")
    base = case.tensor(case.me, torch.float32, numel=4 * NUMEL).view(NUMEL, 4)
    strided = base[:, 1::2]  # every other column: non-contiguous
    before = base.clone()
    case.run(lambda a: dist.all_reduce(strided, group=case.group, async_op=a))
    full = (
        reduced(case.members, torch.float32, ReduceOp.SUM, numel=4 * NUMEL).view(NUMEL, 4)
        if case.is_member
        else before.cpu()
    )
    assert_equal(strided.cpu(), full[:, 1::2], f"all_reduce non-contiguous {case.label}")
    assert_equal(
        base[:, 0::2].cpu(),
        before[:, 0::2].cpu(),
        f"all_reduce non-contiguous untouched columns {case.label}",
    )


def check_reduce(case: Case) -> None:
    root = case.members[-1]
    for dtype, op in _dtype_ops(case):
        tensor = case.tensor(case.me, dtype, op)
        case.run(lambda a: dist.reduce(tensor, dst=root, op=op, group=case.group, async_op=a))
        if case.me == root:
            assert_equal(
                tensor.cpu(), reduced(case.members, dtype, op), f"reduce {dtype} {op.name} {case.label}", op
            )


def check_reduce_scatter(case: Case) -> None:
    n = len(case.members)
    for dtype, op in _dtype_ops(case):
        chunks = [case.tensor(case.me, dtype, op, salt=peer) for peer in range(n)]
        output = torch.zeros(NUMEL, dtype=dtype, device=case.device)
        case.run(lambda a: dist.reduce_scatter(output, chunks, op=op, group=case.group, async_op=a))
        if case.is_member:
            expected = reduced(case.members, dtype, op, salt=case.group_rank)
            assert_equal(output.cpu(), expected, f"reduce_scatter {dtype} {op.name} {case.label}", op)
        flat = torch.cat(chunks)
        flat_out = torch.zeros(NUMEL, dtype=dtype, device=case.device)
        case.run(lambda a: dist.reduce_scatter_tensor(flat_out, flat, op=op, group=case.group, async_op=a))
        if case.is_member:
            assert_equal(
                flat_out.cpu(), expected, f"reduce_scatter_tensor {dtype} {op.name} {case.label}", op
            )


# --- data movement -----------------------------------------------------------------------------


def check_broadcast(case: Case) -> None:
    root = case.members[-1]
    for dtype in _dtypes(case):
        tensor = case.tensor(case.me, dtype)
        case.run(lambda a: dist.broadcast(tensor, src=root, group=case.group, async_op=a))
        expected = values(root if case.is_member else case.me, dtype)
        assert_equal(tensor.cpu(), expected, f"broadcast {dtype} {case.label}")
    strided = case.tensor(case.me, torch.float64, numel=2 * NUMEL)[::2]
    case.run(lambda a: dist.broadcast(strided, src=root, group=case.group, async_op=a))
    source = values(root if case.is_member else case.me, torch.float64, numel=2 * NUMEL)[::2]
    assert_equal(strided.cpu(), source, f"broadcast non-contiguous {case.label}")


def check_all_gather(case: Case) -> None:
    n = len(case.members)
    for dtype in _dtypes(case):
        mine = case.tensor(case.me, dtype)
        outputs = [torch.zeros(NUMEL, dtype=dtype, device=case.device) for _ in range(n)]
        case.run(lambda a: dist.all_gather(outputs, mine, group=case.group, async_op=a))
        stacked = torch.zeros(n, 3, NUMEL // 3, dtype=dtype, device=case.device)
        case.run(
            lambda a: dist.all_gather_into_tensor(stacked, mine.view(3, -1), group=case.group, async_op=a)
        )
        if not case.is_member:
            continue
        for slot, rank in enumerate(case.members):
            assert_equal(
                outputs[slot].cpu(), values(rank, dtype), f"all_gather {dtype} slot {slot} {case.label}"
            )
            assert_equal(
                stacked[slot].cpu(),
                values(rank, dtype),
                f"all_gather_into_tensor {dtype} slot {slot} {case.label}",
            )
    flat = torch.zeros(2 * n * NUMEL, device=case.device)[::2]  # non-contiguous output
    case.run(
        lambda a: dist.all_gather_into_tensor(
            flat, case.tensor(case.me, torch.float32), group=case.group, async_op=a
        )
    )
    if case.is_member:
        expected = torch.cat([values(rank, torch.float32) for rank in case.members])
        assert_equal(flat.cpu(), expected, f"all_gather_into_tensor non-contiguous {case.label}")


def check_all_to_all(case: Case) -> None:
    n = len(case.members)
    for dtype in _dtypes(case):
        inputs = [case.tensor(case.me, dtype, salt=peer) for peer in range(n)]
        outputs = [torch.zeros(NUMEL, dtype=dtype, device=case.device) for _ in range(n)]
        case.run(lambda a: dist.all_to_all(outputs, inputs, group=case.group, async_op=a))
        single_out = torch.zeros(n * NUMEL, dtype=dtype, device=case.device)
        case.run(
            lambda a: dist.all_to_all_single(single_out, torch.cat(inputs), group=case.group, async_op=a)
        )
        if not case.is_member:
            continue
        for slot, rank in enumerate(case.members):
            expected = values(rank, dtype, salt=case.group_rank)
            assert_equal(outputs[slot].cpu(), expected, f"all_to_all {dtype} from {rank} {case.label}")
            assert_equal(
                single_out.view(n, -1)[slot].cpu(),
                expected,
                f"all_to_all_single {dtype} from {rank} {case.label}",
            )
    check_all_to_all_uneven(case)


def check_all_to_all_uneven(case: Case) -> None:
    """Group rank i sends i + j + 1 rows of width 2 to group rank j."""
    n = len(case.members)
    me = case.group_rank if case.is_member else 0
    in_splits = [me + peer + 1 for peer in range(n)]
    out_splits = [peer + me + 1 for peer in range(n)]
    source = case.tensor(case.me, torch.int64, numel=2 * sum(in_splits)).view(-1, 2)
    output = torch.full((sum(out_splits), 2), -1, dtype=torch.int64, device=case.device)
    case.run(
        lambda a: dist.all_to_all_single(output, source, out_splits, in_splits, group=case.group, async_op=a)
    )
    if not case.is_member:
        return
    pieces = []
    for peer, rank in enumerate(case.members):
        rows = values(rank, torch.int64, numel=2 * sum(peer + j + 1 for j in range(n))).view(-1, 2)
        start = sum(peer + j + 1 for j in range(me))
        pieces.append(rows[start : start + peer + me + 1])
    assert_equal(output.cpu(), torch.cat(pieces), f"all_to_all_single uneven {case.label}")


def check_gather_scatter(case: Case) -> None:
    n, root = len(case.members), case.members[-1]
    for dtype in _dtypes(case):
        mine = case.tensor(case.me, dtype)
        slots = (
            [torch.zeros(NUMEL, dtype=dtype, device=case.device) for _ in range(n)]
            if case.me == root
            else None
        )
        case.run(lambda a: dist.gather(mine, slots, dst=root, group=case.group, async_op=a))
        pieces = [case.tensor(root, dtype, salt=peer) for peer in range(n)] if case.me == root else None
        output = torch.zeros(NUMEL, dtype=dtype, device=case.device)
        case.run(lambda a: dist.scatter(output, pieces, src=root, group=case.group, async_op=a))
        if not case.is_member:
            continue
        if case.me == root:
            for slot, rank in enumerate(case.members):
                assert_equal(
                    slots[slot].cpu(), values(rank, dtype), f"gather {dtype} slot {slot} {case.label}"
                )
        assert_equal(output.cpu(), values(root, dtype, salt=case.group_rank), f"scatter {dtype} {case.label}")


# --- point to point, barriers, objects ---------------------------------------------------------


def check_point_to_point(case: Case) -> None:
    if not case.is_member or len(case.members) < 2:
        return
    n, me = len(case.members), case.group_rank
    right, left = case.members[(me + 1) % n], case.members[(me - 1) % n]
    for dtype in _dtypes(case):
        incoming = torch.zeros(NUMEL, dtype=dtype, device=case.device)
        ops = [
            dist.P2POp(dist.isend, case.tensor(case.me, dtype), right, case.group),
            dist.P2POp(dist.irecv, incoming, left, case.group),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        assert_equal(incoming.cpu(), values(left, dtype), f"batch_isend_irecv {dtype} {case.label}")
    a, b = case.members[0], case.members[1]
    strided = torch.zeros(2 * NUMEL, device=case.device)[::2]
    if case.me == a:
        dist.send(case.tensor(a, torch.float32, salt=7), dst=b, group=case.group, tag=3)
        assert dist.recv(strided, src=b, group=case.group, tag=4) == b
        assert_equal(strided.cpu(), values(b, torch.float32, salt=8), f"recv non-contiguous {case.label}")
    elif case.me == b:
        sender = dist.recv(strided, src=None if _any_source(case) else a, group=case.group, tag=3)
        assert sender == a, f"recv reported sender {sender}, expected {a}"
        assert_equal(strided.cpu(), values(a, torch.float32, salt=7), f"recv {case.label}")
        dist.isend(case.tensor(b, torch.float32, salt=8), dst=a, group=case.group, tag=4).wait()


def check_barriers_and_objects(case: Case) -> None:
    case.run(lambda a: dist.barrier(group=case.group, async_op=a))
    if case.async_op:
        return  # the object helpers and monitored_barrier are synchronous only
    dist.monitored_barrier(group=case.group)
    n = len(case.members)
    gathered: list[Any] = [None] * n
    dist.all_gather_object(gathered, {"rank": case.me, "data": [case.me] * (case.me + 1)}, group=case.group)
    if case.is_member:
        assert gathered == [{"rank": r, "data": [r] * (r + 1)} for r in case.members], gathered
    root = case.members[-1]
    payload = [f"from {case.me}", {"k": case.me}, None]
    dist.broadcast_object_list(payload, src=root, group=case.group)
    if case.is_member:
        assert payload == [f"from {root}", {"k": root}, None], payload
    collected = [None] * n if case.me == root else None
    dist.gather_object(("obj", case.me), collected, dst=root, group=case.group)
    if case.me == root:
        assert collected == [("obj", r) for r in case.members], collected
    received: list[Any] = [None]
    dist.scatter_object_list(
        received, [("to", r) for r in case.members] if case.me == root else None, src=root, group=case.group
    )
    if case.is_member:
        assert received == [("to", case.me)], received


def check_getters(case: Case) -> None:
    if case.group is None:
        return
    if not case.is_member:
        assert dist.get_rank(case.group) == -1 and dist.get_world_size(case.group) == -1
        return
    assert dist.get_rank(case.group) == case.group_rank
    assert dist.get_world_size(case.group) == len(case.members)
    assert dist.get_process_group_ranks(case.group) == case.members
    assert [dist.get_global_rank(case.group, i) for i in range(len(case.members))] == case.members
    assert dist.get_group_rank(case.group, case.me) == case.group_rank


def check_unsupported_combinations(backend: Any, device: torch.device) -> None:
    """What the backend does not declare must raise UnsupportedError before communicating."""
    for dtype in DTYPES:
        tensor = values(0, dtype).to(device)
        for op in ReduceOp:
            declared = dtype in backend.capabilities.dtypes and op in backend.capabilities.reduce_ops
            if declared and op in ops_for(dtype):
                continue
            try:
                dist.all_reduce(tensor, op=op)
            except UnsupportedError:
                continue
            raise AssertionError(
                f"all_reduce {dtype} {op.name} on '{backend.name}' should raise UnsupportedError"
            )


CHECKS = (
    check_all_reduce,
    check_all_reduce_large_and_strided,
    check_reduce,
    check_reduce_scatter,
    check_broadcast,
    check_all_gather,
    check_all_to_all,
    check_gather_scatter,
    check_point_to_point,
    check_barriers_and_objects,
    check_getters,
)


# --- helpers -----------------------------------------------------------------------------------


def _dtypes(case: Case) -> list[torch.dtype]:
    return [dtype for dtype in DTYPES if dtype in case.dtypes]


def _dtype_ops(case: Case) -> list[tuple[torch.dtype, ReduceOp]]:
    return [(dtype, op) for dtype in _dtypes(case) for op in ops_for(dtype) if op in case.reduce_ops]


def _any_source(case: Case) -> bool:
    return dist.group.WORLD.primary_backend.capabilities.recv_any_source


def _device(devices: frozenset[str]) -> torch.device:
    if "cpu" in devices:
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)
