"""Tier 1: the Work adapters behave like torch's Work on every backend."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from commlayer.core.errors import CommTimeoutError
from commlayer.core.work import CompletedWork, DeadlineWork, WaitLimit, WorkList


class FlagWork(DeadlineWork):
    """A library request that completes when a test sets its event."""

    def __init__(self, event: threading.Event, limit: WaitLimit, keep_alive: tuple = ()) -> None:
        super().__init__("flag", limit, keep_alive=keep_alive)
        self.event = event

    def _test(self) -> bool:
        return self.event.is_set()


class Flag:
    """A request that completes when a test sets it (group timeout: 30 s, or ``group_timeout_s``)."""

    def __init__(self, group_timeout_s: float = 30.0) -> None:
        self.event = threading.Event()
        self.limit = WaitLimit(group_timeout_s, rank=0, library="test", advice="End the job.")

    def work(self) -> FlagWork:
        return FlagWork(self.event, self.limit)


def test_completed_work() -> None:
    tensor = torch.ones(2)
    work = CompletedWork([tensor])
    assert work.is_completed() and work.wait() and work.is_success()
    assert work.result() == [tensor]
    assert work.get_future().wait() == [tensor]


def test_timed_wait_raises_and_the_work_stays_usable() -> None:
    flag = Flag()
    work = flag.work()
    started = time.monotonic()
    with pytest.raises(CommTimeoutError, match="timed out"):
        work.wait(0.05)
    assert time.monotonic() - started < 1.0
    assert not work.is_completed()
    flag.event.set()
    assert work.wait(1.0) and work.is_completed()


def test_epilogue_runs_once_after_completion() -> None:
    flag, calls = Flag(), []
    work = flag.work().then(lambda: calls.append("done"))
    assert not work.is_completed() and calls == []
    flag.event.set()
    assert work.is_completed() and work.wait() and work.wait()
    assert calls == ["done"]


def test_epilogue_error_surfaces_from_wait() -> None:
    def explode() -> None:
        raise ValueError("copy back failed")

    work = CompletedWork().then(explode)
    with pytest.raises(ValueError, match="copy back failed"):
        work.wait()
    assert work.exception() is not None and not work.is_success()


def test_future_completes_from_a_helper_thread() -> None:
    flag = Flag()
    future = flag.work().get_future()
    assert not future.done()
    flag.event.set()
    assert future.wait() == []


def test_work_list_waits_for_every_member_within_one_deadline() -> None:
    first, second = Flag(), Flag()
    work = WorkList([first.work(), second.work()])
    first.event.set()
    assert not work.is_completed()
    with pytest.raises(CommTimeoutError):
        work.wait(0.05)
    second.event.set()
    assert work.wait(1.0)


def test_untimed_wait_ends_at_the_group_timeout_and_keeps_buffers_alive() -> None:
    flag, expired = Flag(group_timeout_s=0.1), []

    class Expiring(FlagWork):
        def _on_expired(self, message: str) -> None:
            expired.append(message)

    buffer = torch.ones(2)
    work = Expiring(flag.event, flag.limit, keep_alive=(buffer,))
    with pytest.raises(CommTimeoutError) as raised:
        work.wait()
    expected = "flag: the test operation did not complete within the group's timeout of 100 ms (rank 0)"
    assert str(raised.value).startswith(expected) and str(raised.value).endswith("End the job.")
    assert expired == [str(raised.value)]
    assert any(kept == (buffer,) for kept in _abandoned())


def test_a_caller_timeout_leaves_the_op_pending() -> None:
    flag = Flag()
    work = flag.work()
    with pytest.raises(CommTimeoutError, match="still pending and can be waited for again"):
        work.wait(0.01)
    flag.event.set()
    assert work.wait()


def test_source_rank_is_part_of_every_work() -> None:
    with pytest.raises(RuntimeError, match="not a receive from any source"):
        CompletedWork().source_rank()


def _abandoned() -> list:
    from commlayer.core import work

    return work._ABANDONED
