"""The checks of the conformance suite; each records its cells through :meth:`Case.attempt`.

Every rank and element gets a distinct value (:mod:`.values`) and every result is compared
exactly with what each rank computes locally.
"""

from __future__ import annotations

from typing import Any

import torch

from commlayer import dist
from commlayer.core.types import ReduceOp
from commlayer.testing.conformance.case import Case
from commlayer.testing.conformance.values import DTYPES, NUMEL, assert_equal, ops_for, reduced, values

__all__ = ["CHECKS"]


def _dtype_ops() -> list[tuple[torch.dtype, ReduceOp]]:
    return [(dtype, op) for dtype in DTYPES for op in ops_for(dtype)]


# --- reductions --------------------------------------------------------------------------------


def check_all_reduce(case: Case) -> None:
    for dtype, op in _dtype_ops():

        def body(dtype: torch.dtype = dtype, op: ReduceOp = op) -> None:
            tensor = case.tensor(case.me, dtype, op)
            case.run(lambda a: dist.all_reduce(tensor, op=op, group=case.group, async_op=a))
            expected = reduced(case.members, dtype, op) if case.is_member else values(case.me, dtype, op)
            assert_equal(tensor.cpu(), expected, f"all_reduce {dtype} {op.name} {case.label}", op)

        case.attempt("all_reduce", body, dtype, op)


def check_all_reduce_large_and_strided(case: Case) -> None:
    """A 1 MiB buffer (libraries chunk those) and a non-contiguous view (torch 2.13 gloo bug)."""

    def large() -> None:
        big = case.tensor(case.me, torch.float32, numel=1 << 18)
        case.run(lambda a: dist.all_reduce(big, group=case.group, async_op=a))
        expected = (
            reduced(case.members, torch.float32, ReduceOp.SUM, numel=1 << 18)
            if case.is_member
            else values(case.me, torch.float32, numel=1 << 18)
        )
        assert_equal(big.cpu(), expected, f"all_reduce 1MiB {case.label}")

    def strided() -> None:
        base = case.tensor(case.me, torch.float32, numel=4 * NUMEL).view(NUMEL, 4)
        view = base[:, 1::2]  # every other column: non-contiguous
        before = base.clone()
        case.run(lambda a: dist.all_reduce(view, group=case.group, async_op=a))
        full = (
            reduced(case.members, torch.float32, ReduceOp.SUM, numel=4 * NUMEL).view(NUMEL, 4)
            if case.is_member
            else before.cpu()
        )
        assert_equal(view.cpu(), full[:, 1::2], f"all_reduce non-contiguous {case.label}")
        assert_equal(base[:, 0::2].cpu(), before[:, 0::2].cpu(), f"untouched columns {case.label}")

    case.attempt("all_reduce 1MiB", large, torch.float32)
    case.attempt("all_reduce non-contiguous", strided, torch.float32)


def check_reduce(case: Case) -> None:
    root = case.members[-1]
    for dtype, op in _dtype_ops():

        def body(dtype: torch.dtype = dtype, op: ReduceOp = op) -> None:
            tensor = case.tensor(case.me, dtype, op)
            case.run(lambda a: dist.reduce(tensor, dst=root, op=op, group=case.group, async_op=a))
            if case.me == root:
                expected = reduced(case.members, dtype, op)
                assert_equal(tensor.cpu(), expected, f"reduce {dtype} {op.name} {case.label}", op)

        case.attempt("reduce", body, dtype, op)


def check_reduce_scatter(case: Case) -> None:
    n = len(case.members)
    for dtype, op in _dtype_ops():
        chunks = [case.tensor(case.me, dtype, op, salt=peer) for peer in range(n)]
        expected = reduced(case.members, dtype, op, salt=case.group_rank) if case.is_member else None

        def listed(
            dtype: torch.dtype = dtype, op: ReduceOp = op, chunks: Any = chunks, expected: Any = expected
        ) -> None:
            output = torch.zeros(NUMEL, dtype=dtype, device=case.device)
            case.run(lambda a: dist.reduce_scatter(output, chunks, op=op, group=case.group, async_op=a))
            if expected is not None:
                assert_equal(output.cpu(), expected, f"reduce_scatter {dtype} {op.name} {case.label}", op)

        def flat(
            dtype: torch.dtype = dtype, op: ReduceOp = op, chunks: Any = chunks, expected: Any = expected
        ) -> None:
            output = torch.zeros(NUMEL, dtype=dtype, device=case.device)
            source = torch.cat(chunks)
            case.run(
                lambda a: dist.reduce_scatter_tensor(output, source, op=op, group=case.group, async_op=a)
            )
            if expected is not None:
                what = f"reduce_scatter_tensor {dtype} {op.name} {case.label}"
                assert_equal(output.cpu(), expected, what, op)

        case.attempt("reduce_scatter", listed, dtype, op)
        case.attempt("reduce_scatter_tensor", flat, dtype, op)


# --- data movement -----------------------------------------------------------------------------


def check_broadcast(case: Case) -> None:
    root = case.members[-1]
    source_rank = root if case.is_member else case.me
    for dtype in DTYPES:

        def body(dtype: torch.dtype = dtype) -> None:
            tensor = case.tensor(case.me, dtype)
            case.run(lambda a: dist.broadcast(tensor, src=root, group=case.group, async_op=a))
            assert_equal(tensor.cpu(), values(source_rank, dtype), f"broadcast {dtype} {case.label}")

        case.attempt("broadcast", body, dtype)

    def strided() -> None:
        view = case.tensor(case.me, torch.float64, numel=2 * NUMEL)[::2]
        case.run(lambda a: dist.broadcast(view, src=root, group=case.group, async_op=a))
        expected = values(source_rank, torch.float64, numel=2 * NUMEL)[::2]
        assert_equal(view.cpu(), expected, f"broadcast non-contiguous {case.label}")

    case.attempt("broadcast non-contiguous", strided, torch.float64)


def check_all_gather(case: Case) -> None:
    n = len(case.members)
    for dtype in DTYPES:

        def listed(dtype: torch.dtype = dtype) -> None:
            outputs = [torch.zeros(NUMEL, dtype=dtype, device=case.device) for _ in range(n)]
            mine = case.tensor(case.me, dtype)
            case.run(lambda a: dist.all_gather(outputs, mine, group=case.group, async_op=a))
            for slot, rank in enumerate(case.members if case.is_member else ()):
                assert_equal(outputs[slot].cpu(), values(rank, dtype), f"all_gather {dtype} slot {slot}")

        def stacked(dtype: torch.dtype = dtype) -> None:
            output = torch.zeros(n, 3, NUMEL // 3, dtype=dtype, device=case.device)
            mine = case.tensor(case.me, dtype).view(3, -1)
            case.run(lambda a: dist.all_gather_into_tensor(output, mine, group=case.group, async_op=a))
            for slot, rank in enumerate(case.members if case.is_member else ()):
                what = f"all_gather_into_tensor {dtype} slot {slot}"
                assert_equal(output[slot].cpu(), values(rank, dtype), what)

        case.attempt("all_gather", listed, dtype)
        case.attempt("all_gather_into_tensor", stacked, dtype)

    def strided_output() -> None:
        flat = torch.zeros(2 * n * NUMEL, device=case.device)[::2]
        mine = case.tensor(case.me, torch.float32)
        case.run(lambda a: dist.all_gather_into_tensor(flat, mine, group=case.group, async_op=a))
        if case.is_member:
            expected = torch.cat([values(rank, torch.float32) for rank in case.members])
            assert_equal(flat.cpu(), expected, f"all_gather_into_tensor non-contiguous {case.label}")

    case.attempt("all_gather_into_tensor non-contiguous", strided_output, torch.float32)


def check_all_to_all(case: Case) -> None:
    n = len(case.members)
    for dtype in DTYPES:
        inputs = [case.tensor(case.me, dtype, salt=peer) for peer in range(n)]

        def expected(slot: int, dtype: torch.dtype = dtype) -> torch.Tensor:
            return values(case.members[slot], dtype, salt=case.group_rank)

        def listed(dtype: torch.dtype = dtype, inputs: Any = inputs, expected: Any = expected) -> None:
            outputs = [torch.zeros(NUMEL, dtype=dtype, device=case.device) for _ in range(n)]
            case.run(lambda a: dist.all_to_all(outputs, inputs, group=case.group, async_op=a))
            for slot in range(n) if case.is_member else ():
                assert_equal(outputs[slot].cpu(), expected(slot), f"all_to_all {dtype} slot {slot}")

        def single(dtype: torch.dtype = dtype, inputs: Any = inputs, expected: Any = expected) -> None:
            output = torch.zeros(n * NUMEL, dtype=dtype, device=case.device)
            source = torch.cat(inputs)
            case.run(lambda a: dist.all_to_all_single(output, source, group=case.group, async_op=a))
            for slot in range(n) if case.is_member else ():
                what = f"all_to_all_single {dtype} slot {slot}"
                assert_equal(output.view(n, -1)[slot].cpu(), expected(slot), what)

        case.attempt("all_to_all", listed, dtype)
        case.attempt("all_to_all_single", single, dtype)
    case.attempt("all_to_all_single uneven", lambda: _all_to_all_uneven(case), torch.int64)


def _all_to_all_uneven(case: Case) -> None:
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
    for dtype in DTYPES:

        def gather(dtype: torch.dtype = dtype) -> None:
            mine = case.tensor(case.me, dtype)
            slots = [torch.zeros_like(mine) for _ in range(n)] if case.me == root else None
            case.run(lambda a: dist.gather(mine, slots, dst=root, group=case.group, async_op=a))
            for slot, rank in enumerate(case.members if case.me == root else ()):
                assert_equal(slots[slot].cpu(), values(rank, dtype), f"gather {dtype} slot {slot}")

        def scatter(dtype: torch.dtype = dtype) -> None:
            pieces = [case.tensor(root, dtype, salt=peer) for peer in range(n)] if case.me == root else None
            output = torch.zeros(NUMEL, dtype=dtype, device=case.device)
            case.run(lambda a: dist.scatter(output, pieces, src=root, group=case.group, async_op=a))
            if case.is_member:
                expected = values(root, dtype, salt=case.group_rank)
                assert_equal(output.cpu(), expected, f"scatter {dtype} {case.label}")

        case.attempt("gather", gather, dtype)
        case.attempt("scatter", scatter, dtype)


# --- point to point, barriers, objects ---------------------------------------------------------


def check_point_to_point(case: Case) -> None:
    if not case.is_member or len(case.members) < 2 or not case.async_op:
        return  # p2p has no async_op switch: it runs once per group, in the async pass
    n, me = len(case.members), case.group_rank
    right, left = case.members[(me + 1) % n], case.members[(me - 1) % n]
    for dtype in DTYPES:

        def ring(dtype: torch.dtype = dtype) -> None:
            incoming = torch.zeros(NUMEL, dtype=dtype, device=case.device)
            ops = [
                dist.P2POp(dist.isend, case.tensor(case.me, dtype), right, case.group),
                dist.P2POp(dist.irecv, incoming, left, case.group),
            ]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            assert_equal(incoming.cpu(), values(left, dtype), f"batch_isend_irecv {dtype} {case.label}")

        case.attempt("batch_isend_irecv", ring, dtype)
    if case.me in case.members[:2]:
        case.attempt("send/recv non-contiguous", lambda: _send_recv_pair(case), torch.float32)
        _receive_from_any_source(case)
        _match_by_tag(case)


def _send_recv_pair(case: Case) -> None:
    a, b = case.members[0], case.members[1]
    strided = torch.zeros(2 * NUMEL, device=case.device)[::2]
    if case.me == a:
        dist.send(case.tensor(a, torch.float32, salt=7), dst=b, group=case.group)
        assert dist.recv(strided, src=b, group=case.group) == b
        assert_equal(strided.cpu(), values(b, torch.float32, salt=8), f"recv non-contiguous {case.label}")
    else:
        assert dist.recv(strided, src=a, group=case.group) == a
        assert_equal(strided.cpu(), values(a, torch.float32, salt=7), f"recv {case.label}")
        dist.isend(case.tensor(b, torch.float32, salt=8), dst=a, group=case.group).wait()


def _match_by_tag(case: Case) -> None:
    """Two messages in flight between one pair, received in the other order, by tag; undeclared
    (``p2p_tags``), every tagged call must raise before anything is sent."""
    a, b = case.members[0], case.members[1]

    def exchange() -> None:
        if case.me == a:
            sends = [
                dist.isend(case.tensor(a, torch.float32, salt=10 + tag), b, case.group, tag) for tag in (1, 2)
            ]
            for work in sends:
                work.wait()
            return
        second, first = torch.zeros(NUMEL, device=case.device), torch.zeros(NUMEL, device=case.device)
        receives = [dist.irecv(second, a, case.group, 2), dist.irecv(first, a, case.group, 1)]
        for work in receives:
            work.wait()
        assert_equal(second.cpu(), values(a, torch.float32, salt=12), f"recv tag 2 {case.label}")
        assert_equal(first.cpu(), values(a, torch.float32, salt=11), f"recv tag 1 {case.label}")

    case.attempt("send/recv by tag", exchange, torch.float32, declared=case.backend.capabilities.p2p_tags)


def _receive_from_any_source(case: Case) -> None:
    """recv(src=None): the receiver learns the sender's global rank; undeclared, it must raise."""
    a, b = case.members[0], case.members[1]
    declared = case.backend.capabilities.recv_any_source
    if not declared and case.me == a:
        return  # nothing is sent, so the receiver's rejection cannot leave a message behind

    def exchange() -> None:
        if case.me == a:
            dist.send(case.tensor(a, torch.float32, salt=9), dst=b, group=case.group, tag=5)
            return
        incoming = torch.zeros(NUMEL, device=case.device)
        sender = dist.recv(incoming, src=None, group=case.group, tag=5)
        assert sender == a, f"recv(src=None) reported sender {sender}, expected {a}"
        assert_equal(incoming.cpu(), values(a, torch.float32, salt=9), f"recv(src=None) {case.label}")

    case.attempt("recv(src=None)", exchange, torch.float32, declared=declared)


def check_barrier(case: Case) -> None:
    case.attempt("barrier", lambda: case.run(lambda a: dist.barrier(group=case.group, async_op=a)))
    if not case.async_op:  # monitored_barrier is synchronous only
        case.attempt("monitored_barrier", lambda: dist.monitored_barrier(group=case.group))


def check_objects(case: Case) -> None:
    if case.async_op:
        return  # the object helpers are synchronous only
    n, root = len(case.members), case.members[-1]

    def all_gather_object() -> None:
        gathered: list[Any] = [None] * n
        mine = {"rank": case.me, "data": [case.me] * (case.me + 1)}
        dist.all_gather_object(gathered, mine, group=case.group)
        if case.is_member:
            assert gathered == [{"rank": r, "data": [r] * (r + 1)} for r in case.members], gathered

    def broadcast_object_list() -> None:
        payload = [f"from {case.me}", {"k": case.me}, None]
        dist.broadcast_object_list(payload, src=root, group=case.group)
        if case.is_member:
            assert payload == [f"from {root}", {"k": root}, None], payload

    def gather_object() -> None:
        collected = [None] * n if case.me == root else None
        dist.gather_object(("obj", case.me), collected, dst=root, group=case.group)
        if case.me == root:
            assert collected == [("obj", r) for r in case.members], collected

    def scatter_object_list() -> None:
        received: list[Any] = [None]
        sent = [("to", r) for r in case.members] if case.me == root else None
        dist.scatter_object_list(received, sent, src=root, group=case.group)
        if case.is_member:
            assert received == [("to", case.me)], received

    for body in (all_gather_object, broadcast_object_list, gather_object, scatter_object_list):
        case.attempt(body.__name__, body, declared=case.declares_objects())


def check_getters(case: Case) -> None:
    if case.group is None or case.async_op:
        return

    def getters() -> None:
        if not case.is_member:
            assert dist.get_rank(case.group) == -1 and dist.get_world_size(case.group) == -1
            return
        assert dist.get_rank(case.group) == case.group_rank
        assert dist.get_world_size(case.group) == len(case.members)
        assert dist.get_process_group_ranks(case.group) == case.members
        assert [dist.get_global_rank(case.group, i) for i in range(len(case.members))] == case.members
        assert dist.get_group_rank(case.group, case.me) == case.group_rank

    case.attempt("group getters", getters, declared=True)


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
    check_barrier,
    check_objects,
    check_getters,
)
