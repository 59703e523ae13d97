"""Tier 1: the Work adapters behave like torch's Work on every backend."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from commlayer.errors import CommTimeoutError
from commlayer.work import CompletedWork, PolledWork, WorkList


class Flag:
    """A request that completes when a test sets it."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def work(self) -> PolledWork:
        return PolledWork(self.event.is_set, self.event.wait)


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
