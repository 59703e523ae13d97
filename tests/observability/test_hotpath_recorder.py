"""Wiring: the planned hot path enters every call in the flight recorder itself.

The torch backends' fused launchers (``Backend.recorded_plan``) and the facade's own fused
launcher (for backends without one) write the recorder's entry inline instead of through a
wrapper; these checks pin what they write to what ``FlightRecorder.enter`` writes, and show that
debug mode still verifies every planned call. A world of one on gloo in this process; the
point-to-point entries need a peer: ``tests/facade/plans_ranks.py`` checks them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.backends import torch_fast_paths as _torch_plans
from commlayer.core.flight_recorder import FlightRecorder, describe_entry
from commlayer.core.types import ReduceOp
from commlayer.facade.calls import dispatch
from commlayer.facade.groups.group import resolve_group


@pytest.fixture(params=["C", "Python"])
def world(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A world of one, once with the C launchers (where built) and once with the Python ones."""
    if request.param == "C" and not _torch_plans.native_enabled():
        pytest.skip("the C launcher extension is not built")
    monkeypatch.setenv(_torch_plans.C_FAST_PATHS_ENV, "1" if request.param == "C" else "0")
    dist.init_process_group(
        "gloo", store=torch_dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _recorder() -> FlightRecorder:
    return resolve_group("test", None).recorder


def _hot_calls(async_op: bool) -> list[tuple[str, list[int], int, Any]]:
    """Each planned op once, twice over (the second call runs its plan); (op, shape, root, work)."""
    made = []
    for _ in range(2):
        ints = torch.arange(6, dtype=torch.int64).reshape(2, 3)
        made.append(("all_reduce", [2, 3], -1, dist.all_reduce(ints, async_op=async_op)))
        made.append(("broadcast", [4], 0, dist.broadcast(torch.ones(4), src=0, async_op=async_op)))
        gathered = dist.all_gather_into_tensor(torch.zeros(1, 5), torch.ones(5), async_op=async_op)
        made.append(("all_gather_into_tensor", [1, 5], -1, gathered))  # the output is the payload
        scattered = dist.reduce_scatter_tensor(torch.zeros(3), torch.ones(3), async_op=async_op)
        made.append(("reduce_scatter_tensor", [3], -1, scattered))  # the input is the payload
        exchanged = dist.all_to_all_single(torch.zeros(7), torch.ones(7), async_op=async_op)
        made.append(("all_to_all_single", [7], -1, exchanged))
    return made


@pytest.mark.parametrize("async_op", [False, True])
def test_planned_calls_are_entered_like_enter_would(world: None, async_op: bool) -> None:
    first = len(_recorder().snapshot())
    made = _hot_calls(async_op)
    for _, _, _, work in made:
        assert (work is not None) == async_op
        if work is not None:
            work.wait()
    entries = _recorder().snapshot()[first:]
    assert [entry["seq"] for entry in entries] == list(range(first + 1, first + 1 + len(made)))
    for entry, (op, shape, root, _) in zip(entries, made):
        assert (entry["op"], entry["shape"], entry["root"]) == (op, shape, root)
        assert entry["dtype"] == ("int64" if op == "all_reduce" else "float32")
        assert entry["state"] == "completed", entry  # async: read from the live Work
        assert 0 < entry["queued_ns"] <= entry["completed_ns"] if not async_op else entry["queued_ns"] > 0


def test_the_torch_backend_plans_record_themselves(world: None) -> None:
    """No recording wrapper on the torch backends' hot path: the launcher is the backend's."""
    for _ in range(2):
        dist.all_reduce(torch.ones(2))
        dist.all_to_all_single(torch.zeros(2), torch.ones(2))
    native = _torch_plans.native_enabled()
    for plan in dispatch.plans.values():
        if native and plan.call.op == "all_reduce":
            assert isinstance(plan.run, _torch_plans.native.FastPath), plan.run
        else:
            assert plan.run.__module__ == "commlayer.backends.torch_fast_paths", plan.run


def test_an_async_entry_tracks_its_work_weakly(world: None) -> None:
    tensor = torch.ones(3)
    for _ in range(2):
        work = dist.all_reduce(tensor, async_op=True)
        work.wait()
    recorder = _recorder()
    entry = recorder._ring[2 % recorder.capacity]  # the second call's: the plan's
    assert entry is not None and describe_entry(entry)["state"] == "completed"
    del work
    assert describe_entry(entry)["state"] == "released"  # the ring kept no Work (nor its tensors)


def test_debug_mode_still_verifies_every_planned_call(world: None) -> None:
    """With a verifier set (debug mode), plans enter through ``enter``, which runs it first."""
    seen: list[list[Any]] = []
    _recorder().verify = seen.append
    dispatch.forget_plans()
    tensor = torch.ones(2)
    for _ in range(3):
        dist.all_reduce(tensor)
        dist.all_to_all_single(torch.zeros(2), tensor)
    assert [entry[1] for entry in seen] == ["all_reduce", "all_to_all_single"] * 3
    assert torch.equal(tensor, torch.ones(2))


def test_the_python_lookups_decide_as_the_c_ones(world: None) -> None:
    """Where the extension is not built, the Python lookups stand in for PlannedCollective and
    PlannedP2P: the same calls run their plan, the same ones go to the checked path."""
    from commlayer.facade.calls import plans as planned_lookups
    from commlayer.facade.calls.plans import NO_PLAN, native
    from commlayer.facade.ops import p2p

    if native is None:
        pytest.skip("the C lookups are not built")
    tensor = torch.arange(8.0)
    dist.all_reduce(tensor)
    dist.broadcast(tensor, src=0)  # both planned from here on
    lookups = [
        (
            planned_lookups.python_planned("all_reduce", False),
            planned_lookups.planned_all_reduce,
            ReduceOp.SUM,
        ),
        (planned_lookups.python_planned("broadcast", True), planned_lookups.planned_broadcast, 0),
    ]
    for python_lookup, c_lookup, scalar in lookups:
        calls = [
            (tensor, scalar, None, False, None),  # planned: runs, blocking, returns None
            (tensor[::2], scalar, None, False, None),  # strided: staged by the checked path
            ([1.0], scalar, None, False, None),  # not a tensor: named by the checked path
            (tensor, scalar, [], False, None),  # an unhashable group: refused there
            (tensor, scalar, None, False, 0),  # broadcast's group_src: resolved there
            (tensor.int(), scalar, None, False, None),  # another dtype: no plan yet
        ]
        assert python_lookup(*calls[0]) is None and c_lookup(*calls[0]) is None  # both ran the plan
        for call in calls[1:]:
            assert python_lookup(*call) is NO_PLAN and c_lookup(*call) is NO_PLAN, call
    assert planned_lookups.python_planned("broadcast", True)(tensor, True, None, False, None) is NO_PLAN
    assert p2p._python_planned("send", True)(tensor, True, None, 0, None) is NO_PLAN
