"""Pure logic of the launcher's conventions: ``-n auto|gpu|cpu|N``, "did you mean", durations as
people write them, and the held tracebacks that keep a failure on one screen."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from commlayer.core.backend_choice import did_you_mean
from commlayer.core.metrics import format_duration
from commlayer.launch.nproc import resolve_nproc
from commlayer.launch.report import final_report
from commlayer.launch.supervise import LaunchResult, ProcessOutcome
from commlayer.launch.tracebacks import TracebackHold, strip_torch_prefix


@pytest.mark.parametrize(
    ("text", "gpus", "expected"),
    [("3", 0, 3), ("auto", 2, 2), ("auto", 0, os.cpu_count()), ("cpu", 4, os.cpu_count()), ("gpu", 8, 8)],
)
def test_nproc_spellings_follow_torchrun(text: str, gpus: int, expected: int) -> None:
    assert resolve_nproc(text, lambda: gpus) == expected


@pytest.mark.parametrize(("text", "complaint"), [("gpu", "no CUDA device"), ("many", "received 'many'")])
def test_nproc_refuses_clearly(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        resolve_nproc(text, lambda: 0)


def test_unknown_backend_names_get_a_suggestion() -> None:
    assert did_you_mean("ncl", ["gloo", "nccl", "shm"]) == " (did you mean 'nccl'?)"
    assert did_you_mean("GLO", ["gloo", "nccl"]) == " (did you mean 'gloo'?)"
    assert did_you_mean("zzz", ["gloo", "nccl"]) == ""


def test_every_place_a_backend_name_is_accepted_suggests_the_close_one() -> None:
    from commlayer import dist
    from commlayer.core.errors import BackendUnavailableError

    with pytest.raises(
        BackendUnavailableError, match=r"backend 'glo' names no installed backend \(did you mean 'gloo'\?\)"
    ):
        dist.init_process_group("glo", rank=0, world_size=1, store=dist.HashStore())
    done = subprocess.run(
        [sys.executable, "-m", "commlayer", "test-backend", "glo"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "did you mean 'gloo'?" in done.stderr, done.stderr
    environ = {**os.environ, "COMMLAYER_BACKEND": "shn"}
    script = (
        "from commlayer import dist; dist.init_process_group(rank=0, world_size=1, store=dist.HashStore())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environ, check=False
    )
    assert "backend 'shn' names no installed backend (did you mean 'shm'?)" in done.stderr, done.stderr


def test_durations_read_as_people_write_them() -> None:
    assert [format_duration(s) for s in (3, 3.0, 0.25, 1.5, 90, 60, 7260)] == [
        "3 s",
        "3 s",
        "250 ms",
        "1.5 s",
        "1 min 30 s",
        "1 min",
        "2 h 1 min",
    ]


def test_a_traceback_is_held_and_its_exception_kept() -> None:
    hold = TracebackHold()
    lines = [
        "starting",
        "ValueError: first, raised from native code (no traceback of its own)",
        "",
        "The above exception was the direct cause of the following exception:",
        "",
        "Traceback (most recent call last):",
        '  File "y.py", line 2, in <module>',
        "commlayer.core.errors.CommTimeoutError: all_reduce: late",
        "  its second line",
        "Exception raised from sendBytes at Utils.hpp:758 (most recent call first):",
        "frame #0: c10::Error::Error() + 0x9d",
    ]
    assert [hold.feed(line) for line in lines] == [["starting"]] + [[]] * 10
    assert hold.exception == "CommTimeoutError: all_reduce: late"
    assert hold.lines == lines[1:9]
    assert hold.flush() == []


def test_lines_that_only_look_like_an_exception_are_echoed() -> None:
    hold = TracebackHold()
    assert hold.feed("KeyError: 'x' handled, going on") == []
    assert hold.feed("step 2") == ["KeyError: 'x' handled, going on", "step 2"]
    assert hold.feed("RuntimeWarning: late") == [] and hold.flush() == ["RuntimeWarning: late"]
    assert not hold.holding and strip_torch_prefix("[rank3]: Traceback") == "Traceback"


def test_the_report_shows_the_first_failure_in_full_and_one_line_for_others() -> None:
    traceback = ("Traceback (most recent call last):", '  File "t.py"', "KeyError: 'x'")
    outcomes = (
        ProcessOutcome("rank 0", 1, False, (), traceback, "KeyError: 'x'"),
        ProcessOutcome("rank 1", 1, False, (), traceback, "KeyError: 'x'"),
        ProcessOutcome("rank 2", -9, True, ()),
    )
    lines = final_report(LaunchResult(outcomes, first_failure=1), None)
    assert lines == [
        "[rank1] Traceback (most recent call last):",
        '[rank1]   File "t.py"',
        "[rank1] KeyError: 'x'",
        "[rank0] KeyError: 'x'",
        "commlayer run: rank 1 raised KeyError: 'x' and exited with code 1; stopped 1 other rank",
    ]
