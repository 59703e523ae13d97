"""Pure logic around the flight-recorder watchdog: the job id agreed through the store, which job
folders are kept, which errors are worth a dump, the recorder's failed and overdue entries, what
``trace analyze`` says of a rank that raised or dumped without a group, and (in a process of its
own) the watchdog thread dumping on a SIGUSR1 that the main thread never sees."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from commlayer.core import job
from commlayer.core.errors import (
    CollectiveMismatchError,
    CommError,
    CommTimeoutError,
    InvalidArgumentError,
    PeerFailureError,
)
from commlayer.core.flight_recorder import FlightRecorder, write_dump
from commlayer.facade.monitor.dumps import dumps_for
from commlayer.trace_analysis import analyze, load_dumps


def test_every_rank_takes_rank_0s_job_id_from_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job, "_agreed", None)  # restored after: this process's own id stays its own
    store = torch_dist.HashStore()
    agreed = job.agree_job_id(store, 0, {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"})
    assert agreed == "slurm-7.1" and job.current_job_id({}) == "slurm-7.1"
    assert job.agree_job_id(store, 2, {"PMI_RANK": "2"}) == "slurm-7.1"
    fresh = job.agree_job_id(torch_dist.HashStore(), 0, {})  # no launcher id: a new one, not a pid
    assert not fresh.startswith("pid-") and job.current_job_id({}) == fresh


def test_pruning_keeps_the_newest_job_folders_and_nothing_else(tmp_path: Path) -> None:
    for index in range(6):
        folder = tmp_path / f"job-{index}"
        folder.mkdir()
        (folder / "rank0.json").write_text("{}")
        written = time.time() - 3600 + index if index != 1 else time.time()  # job-1 still writes
        for path in (folder / "rank0.json", folder):
            os.utime(path, (written, written))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    spare = tmp_path / "job-0"  # the oldest, but this job's own
    is_job = lambda folder: all(child.name.startswith("rank") for child in folder.iterdir())
    removed = job.prune_job_folders(tmp_path, 4, is_job, spare=spare)
    assert sorted(path.name for path in removed) == ["job-2", "job-3"]  # job-1 sorts first: it writes
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job-0", "job-1", "job-4", "job-5", "notes"]
    removed = job.prune_job_folders(tmp_path, 1, is_job, spare=spare)
    assert sorted(path.name for path in removed) == ["job-4", "job-5"]  # a job still writing stays
    assert sorted(path.name for path in tmp_path.iterdir()) == ["job-0", "job-1", "notes"]
    assert job.prune_job_folders(tmp_path, 0, is_job) == []


def test_only_failures_in_communication_are_dumped() -> None:
    assert dumps_for(PeerFailureError("x")) and dumps_for(CommTimeoutError("x"))
    assert dumps_for(CollectiveMismatchError("x")) and dumps_for(CommError("x"))
    assert not dumps_for(InvalidArgumentError("broadcast: argument 'src' expected ..."))


def test_the_recorder_marks_a_raising_call_and_finds_an_overdue_one() -> None:
    recorder = FlightRecorder("world", (0, 1))
    assert not recorder.recorded_any()
    recorder.enter("all_reduce", torch.ones(2))
    recorder.enter("all_reduce", torch.ones(2))
    recorder.mark_failed("all_reduce")
    states = [entry["state"] for entry in recorder.snapshot()]
    assert states == ["started", "failed"] and recorder.recorded_any()
    assert recorder.overdue(60.0) is None
    assert recorder.overdue(0.0) == (1, "all_reduce")


def _dump(rank: int, groups: list[tuple[str, str]]) -> dict:
    entries = {"world": "started"} | dict(groups)
    return {
        "rank": rank,
        "world_size": 3,
        "reason": "SIGUSR1",
        "groups": [
            {
                "group": name,
                "ranks": [0, 1, 2],
                "last_collective": 4,
                "entries": [{"seq": 4, "op": "all_reduce", "shape": [4], "dtype": "float32", "state": state}],
            }
            for name, state in entries.items()
        ],
    }


def test_analysis_tells_raised_from_waiting_and_never_calls_a_rank_that_dumped_dead(tmp_path: Path) -> None:
    write_dump(tmp_path, 0, _dump(0, [("world", "failed"), ("tp", "started")]))
    write_dump(tmp_path, 1, _dump(1, [("tp", "started")]))
    write_dump(tmp_path, 2, {**_dump(2, []), "groups": []})
    text = "\n".join(analyze(load_dumps(tmp_path)))
    assert "rank 0 raised in all_reduce #4; rank 1 is waiting in all_reduce #4" in text, text
    assert "rank 2 dumped without this group" in text, text
    assert "left no dump" not in text and "no dump from" not in text, text


def _async_dump(rank: int, states: list[str]) -> dict:
    entries = [
        {"seq": seq, "op": "all_gather_into_tensor", "shape": [8], "dtype": "float32", "state": state}
        for seq, state in enumerate(states, start=1)
    ]
    group = {"group": "world", "ranks": [0, 1], "last_collective": len(states), "entries": entries}
    return {"rank": rank, "world_size": 2, "reason": "request", "groups": [group]}


def test_a_dropped_work_is_not_called_waiting(tmp_path: Path) -> None:
    # Released, then a later collective completed: the released ones finished (a group's run in order).
    for rank in (0, 1):
        write_dump(tmp_path, rank, _async_dump(rank, ["released", "released", "completed"]))
    text = "\n".join(analyze(load_dumps(tmp_path)))
    assert "every rank that dumped completed collective #3" in text, text
    # Nothing completed after them: the dump cannot tell, and says so instead of "waiting".
    write_dump(tmp_path, 1, _async_dump(1, ["released", "released"]))
    text = "\n".join(analyze(load_dumps(tmp_path)))
    assert "rank 1 dropped the Work of all_gather_into_tensor #1 before the dump" in text, text
    assert "waiting" not in text, text


_SIGNAL_SCRIPT = """
import os, signal, threading, time
from commlayer.core import watchdog
dumped = []
watchdog.start(dumped.append, lambda: [])
handler = lambda signum, frame: watchdog.note_signal_handler_ran()
signal.signal(signal.SIGUSR1, handler)
assert watchdog.attach_signal_wakeup(handler)
# As when the kernel picks another thread (oneCCL's): the main thread never sees the signal.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
os.kill(os.getpid(), signal.SIGUSR1)
deadline = time.monotonic() + 5
while not dumped and time.monotonic() < deadline:
    time.sleep(0.01)
watchdog.request_dump("asked")
time.sleep(0.5)
print(dumped)
"""


def test_the_watchdog_dumps_on_a_signal_the_main_thread_never_handles() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SIGNAL_SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['SIGUSR1', 'asked']", done.stdout + done.stderr
