"""Pure logic: the torch backends' C fast paths and planned p2p lookup, each driven
with plain Python callables in place of the ProcessGroup method, against what the Python
fast_paths of ``backends/torch_fast_paths.py`` do: the recorder entry, the Work, the wait, errors.
The end-to-end checks (real gloo worlds, exact results) are in
tests/observability/test_hotpath_recorder.py and tests/facade/plans_ranks.py, which run both
kinds of fast_path.
"""

from __future__ import annotations

import gc
import itertools
import time
from typing import Any, NoReturn

import pytest
import torch

from commlayer.backends import torch_fast_paths as _torch_plans
from commlayer.comms_logger.timer import native as _logger_native
from commlayer.core.errors import CommError
from commlayer.core.flight_recorder import COMPLETED, STARTED, WORK, Recording, describe_entry
from commlayer.core.work import Work
from commlayer.facade.calls import plans as _plans

native = _torch_plans.native
pytestmark = pytest.mark.skipif(native is None, reason="the C fast_path extension is not built")


class FakeTorchWork:
    """Stands for torch's C++ Work: counts waits, or fails them."""

    def __init__(self, error: Exception | None = None) -> None:
        self.waits, self.error = 0, error

    def wait(self, *timeout: Any) -> bool:
        self.waits += 1
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.waits > 0


class Translated(CommError):
    pass


def _fail(error: Exception) -> NoReturn:
    raise Translated(f"all_reduce failed: {error}") from error


def _fast_path(shape: int, method: Any, payload: int = 0, capacity: int = 4) -> tuple[Any, list]:
    ring: list = [None] * capacity
    op = "p2p:send" if shape == 2 else "all_reduce"
    recording = Recording(itertools.count(1).__next__, ring, capacity, op, torch.float32, -1, _fail)
    fast_path = native.FastPath(
        shape, method, "sync-options", "async-options", 1, 7, payload, recording, _torch_plans.FastPathWork
    )
    return fast_path, ring


def test_each_shape_calls_the_method_as_torch_expects_and_enters_the_call() -> None:
    calls: list[tuple] = []
    tensor, output = torch.arange(6.0).reshape(2, 3), torch.zeros(2, 6)

    def method(*args: Any) -> FakeTorchWork:
        calls.append(args)
        return FakeTorchWork()

    for shape, operands, expected in (
        (0, (tensor,), ([tensor], "sync-options")),
        (2, (tensor,), ([tensor], 1, 7)),
    ):
        fast_path, ring = _fast_path(shape, method)
        assert fast_path(False, *operands) is None
        assert calls.pop() == expected
        entry = ring[1]
        assert entry[:6] == [1, fast_path.op, torch.Size([2, 3]), torch.float32, -1, COMPLETED]
        assert 0 < entry[6] <= entry[7] and entry[WORK] is None
    fast_path, ring = _fast_path(1, method, payload=0)
    fast_path(False, output, tensor)
    flat_output, flat_input, options = calls.pop()
    assert flat_output.shape == (12,) and flat_input.shape == (6,) and options == "sync-options"
    assert flat_output.data_ptr() == output.data_ptr() and ring[1][2] == torch.Size([2, 6])


def test_an_async_call_returns_a_torch_work_the_entry_tracks_weakly() -> None:
    tensor = torch.ones(3)
    fast_path, ring = _fast_path(0, lambda tensors, options: FakeTorchWork())
    work = fast_path(True, tensor)
    assert isinstance(work, Work) and type(work) is _torch_plans.FastPathWork
    assert work.result()[0] is tensor and describe_entry(ring[1])["state"] == STARTED
    assert work.wait() is True and work.torch_work.waits == 1
    assert work.wait() is True and work.torch_work.waits == 1  # never waits twice
    assert describe_entry(ring[1])["state"] == COMPLETED
    del work
    assert describe_entry(ring[1])["state"] == "released"


def test_the_ring_wraps_and_its_entries_stay_out_of_the_cyclic_collector() -> None:
    fast_path, ring = _fast_path(0, lambda tensors, options: None, capacity=3)
    works = [fast_path(True, torch.ones(2)) for _ in range(5)]
    assert [entry[0] for entry in ring] == [3, 4, 5]
    assert not any(gc.is_tracked(entry) or gc.is_tracked(entry[2]) for entry in ring)
    assert not any(gc.is_tracked(entry[WORK]) for entry in ring)
    del works


def test_a_failing_call_goes_through_fail_inside_an_except_block() -> None:
    def method(tensors: Any, options: Any) -> NoReturn:
        raise RuntimeError("NCCL error: unhandled system error")

    fast_path, ring = _fast_path(0, method)
    with pytest.raises(Translated, match="all_reduce failed: NCCL error") as raised:
        fast_path(False, torch.ones(1))
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert ring[1][5] == STARTED  # entered, never completed: what a dump must show
    failing_wait = lambda tensors, options: FakeTorchWork(RuntimeError("Connection reset by peer"))
    fast_path, _ = _fast_path(0, failing_wait)
    with pytest.raises(Translated, match="Connection reset"):
        fast_path(False, torch.ones(1))
    with pytest.raises(KeyboardInterrupt):  # not an Exception: passes untranslated
        _fast_path(0, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))[0](False, torch.ones(1))


def test_the_c_wait_leaves_timed_waits_and_errors_to_the_python_path() -> None:
    fast_path, _ = _fast_path(2, lambda tensors, peer, tag: FakeTorchWork())
    work = fast_path(True, torch.ones(1))
    assert work.wait(timeout=5.0) is True and work.torch_work.waits == 1  # Work.wait's timed path
    failing = fast_path(True, torch.ones(1))
    failing.torch_work.error = RuntimeError("gloo: connection closed by peer")
    with pytest.raises(RuntimeError, match="connection closed"):
        failing.wait()
    with pytest.raises(TypeError):
        work.wait(1, 2, 3, 4)
    done = fast_path(True, torch.ones(1))
    assert done.wait() is True and done.wait(timeout=1.0) is True and done.torch_work.waits == 1
    assert done.is_completed() and done.is_success() and done.exception() is None


def test_the_c_work_answers_the_rest_of_work_through_torch_work() -> None:
    tensor = torch.ones(2)
    fast_path, _ = _fast_path(2, lambda tensors, peer, tag: FakeTorchWork())
    work = fast_path(True, tensor)
    assert not work.is_completed()
    ran: list[int] = []
    chained = work.then(lambda: ran.append(1))
    assert chained.wait() is True and ran == [1] and work.torch_work.waits == 1
    assert work.wait() is True and work.torch_work.waits == 1  # the chain's wait counts
    future = fast_path(True, tensor).get_future()
    assert future.wait()[0] is tensor
    with pytest.raises(AttributeError):
        _ = work.no_such_attribute


def test_bad_launcher_arguments_are_refused() -> None:
    fast_path, _ = _fast_path(1, lambda *args: None)
    with pytest.raises(TypeError, match="expected \\(async_op, 2 tensor"):
        fast_path(False, torch.ones(1))
    with pytest.raises(ValueError, match="shape in 0..2"):
        _fast_path(3, print)


def test_planned_p2p_runs_only_a_plan_its_key_vouches_for() -> None:
    seen: list[tuple] = []
    no_plan = object()
    tensor = torch.ones(4)
    plans: dict = {
        ("send", None, 1, 0, tensor.dtype, tensor.device, tensor.layout): (
            lambda async_op, t: seen.append((async_op, t)) or "work",
        )
    }
    planned = _plans.native.PlannedP2P(plans, "send", True, no_plan)
    assert planned(tensor, 1, None, 0, None) == "work" and seen == [(True, tensor)]
    refused = [
        (tensor, True, None, 0, None),  # True == 1 as a key, but not an int peer
        (tensor, 1.0, None, 0, None),
        (tensor, 1, None, 0, 1),  # group_dst given
        (tensor, 1, [], 0, None),  # unhashable group
        ("not a tensor", 1, None, 0, None),
        (torch.ones(4, 2).t(), 1, None, 0, None),  # no plan for its key... and not contiguous
        (torch.ones(8)[::2], 1, None, 0, None),  # same key, not contiguous: staged by Python
        (tensor.double(), 1, None, 0, None),
    ]
    for arguments in refused:
        assert planned(*arguments) is no_plan, arguments
    assert len(seen) == 1
    plans.clear()  # what forget_plans() does when a group or the world goes: the C lookup misses too
    assert planned(tensor, 1, None, 0, None) is no_plan and len(seen) == 1


class MutableOwner:
    """Stands for the comms logger: the timer reads its ``_muted_thread`` on every call."""

    _muted_thread: int | None = None


def _timer(run: Any, payload: int = 0, drain_at: int = 3) -> tuple[Any, Any, list, list, MutableOwner]:
    """The timer, its log (capacity 4), what reached the observed run, what was drained, its owner."""
    log = _logger_native.TimedLog(4)
    observed: list = []
    drained: list = []
    owner = MutableOwner()

    def observed_run(async_op: bool, *tensors: torch.Tensor) -> str:
        observed.append((async_op, tensors))
        return "observed"

    def drain(max_events: int) -> None:
        drained.append((max_events, log.fold()))

    label = ("all_reduce", "gloo", "world", 2, 0)
    timer = _logger_native.Timed(run, observed_run, owner, label, log, drain, 99, drain_at, payload)
    return timer, log, observed, drained, owner


def test_the_c_timer_enters_blocking_calls_and_hands_the_rest_to_the_observed_run() -> None:
    calls: list = []
    timer, log, seen, _, owner = _timer(
        lambda async_op, *tensors: calls.append((async_op, tensors)), payload=1
    )
    output, tensor = torch.zeros(4), torch.zeros(2, dtype=torch.float64)
    assert timer(False, output, tensor) is None
    assert calls == [(False, (output, tensor))]
    ((label, nbytes, began, ended),) = log.events()
    assert label[0] == "all_reduce" and nbytes == tensor.nbytes == 16 and began <= ended
    assert abs(ended - time.perf_counter()) < 1.0  # the logger's clock
    assert timer(True, output, tensor) == "observed"  # async: the logger's ordinary path
    owner._muted_thread = 1
    assert timer(False, output, tensor) == "observed"  # summary()'s own traffic
    assert seen == [(True, (output, tensor)), (False, (output, tensor))] and log.unfolded == 1


def test_the_c_log_folds_each_label_and_size_and_keeps_the_most_recent_calls() -> None:
    timer, log, _, drained, _ = _timer(lambda async_op, tensor: None, drain_at=4)
    sizes = [4, 4, 8, 4]
    for size in sizes:
        timer(False, torch.zeros(size, dtype=torch.float64))
    ((max_events, folded),) = drained
    assert max_events == 99 and [row[1:3] for row in folded] == [(32, 3), (64, 1)] and log.unfolded == 0
    for label, _, count, total_s, min_s, max_s in folded:
        assert label[0] == "all_reduce" and 0 <= min_s <= total_s / count <= max_s <= total_s
    timer(False, torch.zeros(2, dtype=torch.float64))  # the ring of 4 drops the oldest call
    assert [event[1] for event in log.events()] == [32, 64, 32, 16] and log.dropped() == 1
    assert [row[1:3] for row in log.fold()] == [(16, 1)]
    log.clear()
    assert log.events() == [] and log.dropped() == 0 and log.unfolded == 0 and log.fold() == []
    with pytest.raises(ValueError, match="drain_at <= the log's capacity"):
        _logger_native.Timed(print, print, MutableOwner(), (), log, print, 99, 5, 0)


def test_the_c_timer_drains_when_full_and_enters_nothing_when_the_run_fails() -> None:
    timer, log, _, drained, _ = _timer(lambda async_op, tensor: None, drain_at=3)
    for _ in range(3):
        timer(False, torch.zeros(1))
    assert [(max_events, [row[1:3] for row in folded]) for max_events, folded in drained] == [(99, [(4, 3)])]
    assert log.unfolded == 0

    def failing(async_op: bool, tensor: torch.Tensor) -> None:
        raise Translated("all_reduce failed")

    timer, log, _, _, _ = _timer(failing)
    with pytest.raises(Translated, match="all_reduce failed"):
        timer(False, torch.zeros(1))
    assert log.events() == [] and log.unfolded == 0
    with pytest.raises(TypeError, match="Timed: expected"):
        timer(False)
