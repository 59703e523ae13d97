"""Wiring: the hot path's plans are reused, and dropped or bypassed whenever validation would differ.

A world of one on gloo in this process: every check here fires before or without communication.
The multi-rank half (exact results while metadata, groups and observers change) is
``tests/facade/plans_ranks.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from commlayer import comms_logger, dist
from commlayer.comms_logger import logger as _logger
from commlayer.comms_logger import timer as _timer
from commlayer.core.errors import InvalidArgumentError, UnsupportedError
from commlayer.core.types import ReduceOp
from commlayer.facade.calls import dispatch
from commlayer.facade.ops import in_place as planned_collectives
from commlayer.facade.ops import into_tensor as planned_paired_collectives
from commlayer.testing import run_world


def _init() -> None:
    dist.init_process_group(
        "gloo", store=torch_dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20)
    )


@pytest.fixture
def world() -> Iterator[None]:
    _init()
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _keys(op: str) -> list[tuple]:
    return [key for key in dispatch.plans if key[0] == op]


def test_one_plan_per_kind_of_call_reused_until_metadata_changes(world: None) -> None:
    tensor = torch.arange(4.0)
    dist.all_reduce(tensor)
    plan = dispatch.plans[("all_reduce", None, ReduceOp.SUM, torch.float32, tensor.device, torch.strided)]
    for _ in range(3):
        dist.all_reduce(tensor)
    assert _keys("all_reduce") == [
        ("all_reduce", None, ReduceOp.SUM, torch.float32, tensor.device, torch.strided)
    ]
    assert dispatch.plans[_keys("all_reduce")[0]] is plan
    dist.all_reduce(torch.arange(4, dtype=torch.int64), op=ReduceOp.MAX)
    assert len(_keys("all_reduce")) == 2  # another dtype and op: another plan
    assert torch.equal(tensor, torch.arange(4.0))


def test_the_second_call_of_each_hot_op_takes_its_plan(world: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each op's fast path spells its key out; a mismatch with its checked path would re-check forever."""
    small, large, output = torch.arange(2.0), torch.arange(2.0), torch.zeros(2)
    one, paired = planned_collectives, planned_paired_collectives
    calls = {
        (one, "_checked_all_reduce"): lambda: dist.all_reduce(small, async_op=True).wait(),
        (one, "_checked_broadcast"): lambda: dist.broadcast(small, src=0),
        (paired, "_checked_all_gather_into_tensor"): lambda: dist.all_gather_into_tensor(output, small),
        (paired, "_checked_reduce_scatter_tensor"): lambda: dist.reduce_scatter_tensor(output, large),
        (paired, "_checked_all_to_all_single"): lambda: dist.all_to_all_single(output, large, [2], [2]),
    }
    for call in calls.values():
        call()
    for module, name in calls:
        monkeypatch.setattr(module, name, lambda *args, name=name: pytest.fail(f"{name} ran again"))
    for call in calls.values():
        call()
    # send/recv need a peer: tests/facade/plans_ranks.py checks theirs the same way.


def test_plans_hold_what_validation_checked_and_nothing_else(world: None) -> None:
    ok = torch.arange(2.0)
    dist.all_gather_into_tensor(torch.zeros(2), ok)
    dist.reduce_scatter_tensor(torch.zeros(2), ok)
    dist.broadcast(ok, src=0)
    dist.all_to_all_single(torch.zeros(2), ok)
    # The same dtypes, devices and layouts as the plans above, but invalid: each still raises.
    with pytest.raises(
        InvalidArgumentError, match=r"all_gather_into_tensor: argument 'output_tensor' expected 2 elements"
    ):
        dist.all_gather_into_tensor(torch.zeros(3), ok)
    with pytest.raises(
        InvalidArgumentError, match=r"reduce_scatter_tensor: argument 'input' expected 3 elements"
    ):
        dist.reduce_scatter_tensor(torch.zeros(3), ok)
    with pytest.raises(
        InvalidArgumentError, match=r"broadcast: argument 'src' expected a global rank .* received True"
    ):
        dist.broadcast(ok, src=True)
    with pytest.raises(
        InvalidArgumentError, match=r"broadcast: argument 'src' expected a global rank .* received 0.0"
    ):
        dist.broadcast(ok, src=0.0)
    with pytest.raises(
        InvalidArgumentError, match=r"broadcast: argument 'src' expected either src or group_src"
    ):
        dist.broadcast(ok, src=0, group_src=0)
    with pytest.raises(
        InvalidArgumentError, match=r"all_to_all_single: argument 'input_split_sizes'.*rank 0"
    ):
        dist.all_to_all_single(torch.zeros(2), ok, input_split_sizes=[3])
    with pytest.raises(
        InvalidArgumentError, match=r"all_gather_into_tensor: argument 'output_tensor' expected dtype"
    ):
        dist.all_gather_into_tensor(torch.zeros(2, dtype=torch.int64), ok)


def test_a_torch_reduce_op_never_lets_a_plain_int_through(world: None) -> None:
    tensor = torch.ones(2)
    dist.all_reduce(tensor, op=torch_dist.ReduceOp.SUM)  # torch's SUM equals 0 and hashes as 0
    with pytest.raises(InvalidArgumentError, match=r"all_reduce: argument 'op' expected a ReduceOp"):
        dist.all_reduce(tensor, op=0)


def test_layouts_the_key_separates_still_raise(world: None) -> None:
    dense = torch.ones(4)
    dist.all_reduce(dense)
    with pytest.raises(
        UnsupportedError, match=r"all_reduce: argument 'tensor' expected a dense \(strided\) tensor"
    ):
        dist.all_reduce(dense.to_sparse())
    with pytest.raises(UnsupportedError, match="expected a dense"):
        dist.all_reduce(dense.to_mkldnn())  # is_contiguous() is True for these: the key catches them


def test_non_contiguous_tensors_are_staged_even_when_a_plan_exists(world: None) -> None:
    base = torch.arange(12.0).reshape(3, 4)
    dist.all_reduce(base)
    column = base[:, 1]
    dist.all_reduce(column)  # same key as `base`'s plan, but strided: staged and copied back
    assert torch.equal(base, torch.arange(12.0).reshape(3, 4))
    work = dist.all_reduce(column, async_op=True)
    work.wait()
    assert torch.equal(column, torch.tensor([1.0, 5.0, 9.0]))
    output = torch.zeros(4, 2)[:, 0]
    dist.all_gather_into_tensor(torch.zeros(4), torch.ones(4))
    dist.all_gather_into_tensor(output, torch.arange(4.0))
    assert torch.equal(output, torch.arange(4.0))


def test_destroying_a_group_or_the_world_drops_every_plan() -> None:
    _init()
    try:
        subgroup = dist.new_group([0])
        dist.all_reduce(torch.ones(1), group=subgroup)
        dist.all_reduce(torch.ones(1))
        assert len(_keys("all_reduce")) == 2
        dist.destroy_process_group(subgroup)
        assert not dispatch.plans
        dist.all_reduce(torch.ones(1))
        old_backend = dispatch.plans[_keys("all_reduce")[0]].call.backend
    finally:
        dist.destroy_process_group()
    assert not dispatch.plans
    with pytest.raises(Exception, match="not initialized"):
        dist.all_reduce(torch.ones(1))
    _init()
    try:
        tensor = torch.full((2,), 3.0)
        dist.all_reduce(tensor)
        assert torch.equal(tensor, torch.full((2,), 3.0))
        assert dispatch.plans[_keys("all_reduce")[0]].call.backend is not old_backend
    finally:
        dist.destroy_process_group()


def test_the_observer_sees_planned_ops_and_plans_are_rebuilt_around_it(world: None) -> None:
    tensor = torch.ones(3)
    dist.all_reduce(tensor)
    unobserved = dispatch.plans[_keys("all_reduce")[0]]
    comms_logger.reset()
    comms_logger.enable()
    try:
        assert not dispatch.plans
        dist.all_reduce(tensor)
        dist.all_reduce(tensor, async_op=True).wait()
        dist.broadcast(tensor, src=0)
        assert dispatch.plans[_keys("all_reduce")[0]] is not unobserved
        counts = {op: rows[12]["count"] for op, rows in comms_logger.stats().items()}
    finally:
        comms_logger.disable()
        comms_logger.reset()
    assert counts == {"all_reduce": 2, "broadcast": 1}
    assert not dispatch.plans


@pytest.mark.parametrize("timer", ["c", "python"])
def test_the_logger_records_blocking_planned_ops_in_bulk(
    world: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, timer: str
) -> None:
    if timer == "python":  # the reference timer (pending tuples) instead of the C one (its log)
        monkeypatch.setattr(_timer, "native", None)
    elif _timer.native is None:
        pytest.skip("the C fast path extension is not built")
    monkeypatch.setattr(_timer, "DRAIN_AT", 5)  # fold pending entries in several times below
    tensor = torch.arange(3.0)
    comms_logger.reset()
    comms_logger.enable(ops=["all_reduce"], max_trace_events=10)
    try:
        began = time.time() * 1e6
        for _ in range(12):
            dist.all_reduce(tensor)
        dist.broadcast(tensor, src=0)  # not asked for: not recorded
        ended = time.time() * 1e6
        assert len(_logger._records.pending) < 5
        stats = comms_logger.stats()
        trace = json.loads(comms_logger.export_chrome_trace(tmp_path / "trace.json").read_text())
    finally:
        comms_logger.disable()
        comms_logger.reset()
    assert list(stats) == ["all_reduce"] and stats["all_reduce"][12]["count"] == 12
    latency = stats["all_reduce"][12]["latency_us"]
    assert 0 < latency["min"] <= latency["avg"] <= latency["max"] < ended - began
    events = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    assert [event["name"] for event in events] == ["all_reduce"] * 10  # the 10 most recent
    assert all(began <= event["ts"] <= event["ts"] + event["dur"] <= ended for event in events)
    assert trace["otherData"]["dropped_events_by_rank"] == {"0": 2}
    assert torch.equal(tensor, torch.arange(3.0))


@pytest.mark.multirank
def test_plans_give_exact_results_while_metadata_groups_and_observers_change() -> None:
    run_world("tests.facade.plans_ranks:main", 3, backend="gloo", timeout=180)
