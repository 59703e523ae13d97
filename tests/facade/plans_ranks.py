"""The hot path's plans under change, with exact results (run at 3 ranks by tests/facade/test_plans.py).

Each op runs repeatedly while what its plan was built for changes between calls: dtype, shape,
contiguity, sync/async, root and peer, the group (a subgroup is destroyed and another built in its
place, on other ranks), and the comms logger being switched on. Every rank and element carries a
distinct value, so a plan reused where it should not be shows as a wrong number.
"""

from __future__ import annotations

import torch

from commlayer import comms_logger, dist
from commlayer.core.types import ReduceOp
from commlayer.facade.calls import dispatch
from commlayer.facade.groups.group import resolve_group
from commlayer.facade.ops import p2p
from commlayer.testing.conformance import assert_equal, reduced, values

DTYPES = (torch.float32, torch.int64, torch.float32)  # back to float32: a plan met again


def _maybe_strided(tensor: torch.Tensor, strided: bool) -> torch.Tensor:
    """``tensor``'s values in a non-contiguous view when ``strided`` (every other column)."""
    if not strided:
        return tensor.clone()
    holder = torch.zeros(tensor.numel(), 2, dtype=tensor.dtype)
    holder[:, 0] = tensor
    return holder[:, 0]


def _finish(work: object, async_op: bool) -> None:
    if async_op:
        work.wait()  # type: ignore[attr-defined]
    else:
        assert work is None


def check_all_reduce(members: list[int], group: object, me: int) -> None:
    for round_index, dtype in enumerate(DTYPES):
        for strided in (False, True):
            for async_op in (False, True):
                salt = round_index * 4 + strided * 2 + async_op
                tensor = _maybe_strided(values(me, dtype, salt=salt), strided)
                work = dist.all_reduce(tensor, ReduceOp.SUM, group=group, async_op=async_op)
                if me not in members:
                    assert work is None and torch.equal(tensor, values(me, dtype, salt=salt))
                    continue
                _finish(work, async_op)
                assert_equal(tensor, reduced(members, dtype, ReduceOp.SUM, salt=salt), f"all_reduce {dtype}")


def check_broadcast_each_root(members: list[int], group: object, me: int) -> None:
    for root in members * 2:  # each root twice: plans per root, met again
        tensor = values(me, torch.float32, salt=root)
        dist.broadcast(tensor, src=root, group=group)
        assert_equal(tensor, values(root, torch.float32, salt=root), f"broadcast from {root}")


def check_gather_scatter(members: list[int], group: object, me: int) -> None:
    size, rank = len(members), members.index(me)
    for numel in (3, 5, 3):  # sizes change under one plan: the element counts are per call
        mine = values(me, torch.float32, numel=numel)
        stacked = torch.zeros(size, numel)  # a 2-D output: the (n, *shape) spelling
        dist.all_gather_into_tensor(stacked, mine, group=group)
        assert_equal(stacked, torch.stack([values(r, torch.float32, numel=numel) for r in members]), "gather")
        full = values(me, torch.float32, numel=numel * size)
        part = _maybe_strided(torch.zeros(numel), numel == 5)
        dist.reduce_scatter_tensor(part, full, group=group)
        total = reduced(members, torch.float32, ReduceOp.SUM, numel=numel * size)
        assert_equal(part, total[rank * numel : (rank + 1) * numel], "reduce_scatter_tensor")


def check_all_to_all(members: list[int], group: object, me: int) -> None:
    size, rank = len(members), members.index(me)
    for splits in (None, list(range(1, size + 1)), None):
        send_counts = [1] * size if splits is None else [splits[(rank + peer) % size] for peer in range(size)]
        receive_counts = (
            [1] * size if splits is None else [splits[(peer + rank) % size] for peer in range(size)]
        )
        source = values(me, torch.int64, numel=sum(send_counts))
        output = torch.zeros(sum(receive_counts), dtype=torch.int64)
        dist.all_to_all_single(
            output,
            source,
            None if splits is None else receive_counts,
            None if splits is None else send_counts,
            group=group,
        )
        expected = []
        for peer_rank, peer in enumerate(members):
            peer_counts = (
                [1] * size if splits is None else [splits[(peer_rank + p) % size] for p in range(size)]
            )
            start = sum(peer_counts[:rank])
            expected.append(
                values(peer, torch.int64, numel=sum(peer_counts))[start : start + peer_counts[rank]]
            )
        assert_equal(output, torch.cat(expected), f"all_to_all_single splits={splits}")


def check_ring(members: list[int], group: object, me: int) -> None:
    rank, size = members.index(me), len(members)
    after, before = members[(rank + 1) % size], members[(rank - 1) % size]
    for tag, dtype in enumerate(DTYPES):
        sending = dist.isend(values(me, dtype, salt=tag), dst=after, group=group, tag=tag)
        received = torch.zeros(12, dtype=dtype)
        assert dist.recv(received, src=before, group=group, tag=tag) == before
        sending.wait()
        assert_equal(received, values(before, dtype, salt=tag), f"recv from {before}")
        receiving = dist.irecv(received, src=before, group=group, tag=tag)
        dist.send(values(me, dtype, salt=tag + 7), dst=after, group=group, tag=tag)
        receiving.wait()
        assert_equal(received, values(before, dtype, salt=tag + 7), f"irecv from {before}")


def check_ring_takes_its_plans(members: list[int], group: object, me: int) -> None:
    """After check_ring, the same sends and receives must not be validated (prepared) again, and
    isend/irecv must find their plans themselves (only send/recv go through _point_to_point)."""
    prepare, point_to_point = p2p.prepare_p2p, p2p._point_to_point

    def refuse(*args: object) -> None:
        raise AssertionError(f"p2p re-checked: {args[:1]}")

    def blocking_only(*args: object) -> object:
        assert args[-1] is False, f"isend/irecv missed their plan: {args[:1]}"
        return point_to_point(*args)

    p2p.prepare_p2p, p2p._point_to_point = refuse, blocking_only
    try:
        check_ring(members, group, me)
    finally:
        p2p.prepare_p2p, p2p._point_to_point = prepare, point_to_point
    check_ring_recorded(group)


def check_ring_recorded(group: object) -> None:
    """check_ring's planned sends and receives are in the flight recorder's point-to-point ring,
    as ``FlightRecorder.enter`` writes them (the fused fast paths record inline)."""
    entries = [entry for entry in resolve_group("check", group).recorder.snapshot() if "p2p:" in entry["op"]]
    last = entries[-4 * len(DTYPES) :]
    assert [entry["op"] for entry in last] == ["p2p:send", "p2p:recv", "p2p:recv", "p2p:send"] * len(DTYPES)
    expected_dtypes = [str(dtype).replace("torch.", "") for dtype in DTYPES for _ in range(4)]
    assert [entry["dtype"] for entry in last] == expected_dtypes
    assert all(entry["shape"] == [[12]] and entry["root"] == -1 for entry in last), last
    assert [entry["seq"] for entry in last] == list(range(last[0]["seq"], last[0]["seq"] + len(last)))
    states = [entry["state"] for entry in last]
    assert states[1::4] == states[3::4] == ["completed"] * len(DTYPES), states  # the blocking ones
    assert set(states) <= {"completed", "released"}, states  # async: the Work is gone or done


def run_all(members: list[int], group: object, me: int) -> None:
    check_all_reduce(members, group, me)
    if me not in members:
        return
    check_broadcast_each_root(members, group, me)
    check_gather_scatter(members, group, me)
    check_all_to_all(members, group, me)
    check_ring(members, group, me)
    if group is None and not comms_logger.is_enabled():
        check_ring_takes_its_plans(members, group, me)


def main() -> None:
    me, world = dist.get_rank(), dist.get_world_size()
    everyone = list(range(world))
    run_all(everyone, None, me)
    assert dispatch.plans, "the world's ops should have left plans"
    for ranks in ([0, world - 1], [1, world - 1]):  # one subgroup, destroyed, then another
        subgroup = dist.new_group(ranks)
        run_all(ranks, subgroup, me)
        if me in ranks:
            dist.destroy_process_group(subgroup)
            assert not dispatch.plans
    comms_logger.reset()
    comms_logger.enable()
    try:
        run_all(everyone, None, me)
        assert comms_logger.stats()["all_reduce"], "planned ops must reach the logger"
    finally:
        comms_logger.disable()
        comms_logger.reset()
    run_all(everyone, None, me)
