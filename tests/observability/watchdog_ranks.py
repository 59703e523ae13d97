"""Rank body of tests/observability/test_watchdog.py: SIGUSR1 reaches every rank of a 3-rank world
while ranks 0 and 2 wait inside all_reduce and rank 1 sleeps; the watchdog threads dump all three.

Rank 1 sends the signals (to every rank's pid, its own too), waits up to 2 s for three SIGUSR1
dumps in the job's folder, checks what ``trace analyze`` says about them, then joins the
all_reduce that lets the others go. Then rank 1 sleeps before each of a few more all_reduces,
every rank dumps on request, and ``trace analyze --arrivals`` must name rank 1 as the rank
furthest behind.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import torch

from commlayer import dist
from commlayer.facade.groups.group import current_world
from commlayer.facade.monitor.dumps import job_trace_directory
from commlayer.trace_analysis import analyze, arrivals, describe_arrivals, load_dumps

DUMP_LIMIT_S = 2.0
LATE_S = 0.03  # rank 1's sleep before each call of the arrivals check
_ENTERING = "watchdog-test/entering/{}"


def blocked_then_late() -> None:
    sigusr1_while_blocked()
    arrivals_name_the_late_rank()


def sigusr1_while_blocked() -> None:
    rank = dist.get_rank()
    pids: list[int | None] = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    tensor = torch.full((4,), float(rank))
    store = current_world("watchdog test").store
    if rank != 1:
        store.set(_ENTERING.format(rank), "1")
        dist.all_reduce(tensor)  # waits for rank 1, which sleeps meanwhile
        assert tensor.tolist() == [3.0] * 4, tensor
        return
    store.wait([_ENTERING.format(0), _ENTERING.format(2)])
    time.sleep(0.5)  # ranks 0 and 2 are inside all_reduce now
    folder = job_trace_directory()
    sent = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    dumps = _sigusr1_dumps(folder, sent)
    elapsed = time.monotonic() - sent
    assert sorted(dumps) == [0, 1, 2], (
        f"after {elapsed:.2f} s only ranks {sorted(dumps)} dumped into {folder}"
    )
    assert len({dump["job"] for dump in dumps.values()}) == 1, dumps
    findings = "\n".join(analyze(load_dumps(folder)))
    seq = dumps[0]["groups"][0]["last_collective"]
    assert f"rank 1 never entered all_reduce #{seq}" in findings, findings
    assert f"ranks 0, 2 are waiting in all_reduce #{seq}" in findings, findings
    assert "left no dump" not in findings, findings
    dist.all_reduce(tensor)


def arrivals_name_the_late_rank(calls: int = 4) -> None:
    rank = dist.get_rank()
    for call in range(calls):
        if rank == 1:
            time.sleep(LATE_S)
        tensor = torch.full((4,), float(rank * 10 + call))
        dist.all_reduce(tensor)
        assert tensor.tolist() == [30.0 + 3 * call] * 4, tensor
    folder = job_trace_directory() / "arrivals"
    dist.dump_flight_recorder(folder, reason="arrivals check")
    dist.barrier()
    if rank != 0:
        return
    (found,) = arrivals(load_dumps(folder))
    lateness = found.lateness()
    assert max(lateness, key=lateness.__getitem__) == 1, lateness
    assert lateness[1] >= calls * LATE_S / 2, lateness  # each sleep delays rank 1's entry
    assert found.last_counts()[1] >= calls, found.last_counts()
    line = describe_arrivals(found)
    assert line.startswith("group 'world' (ranks 0, 1, 2): arrivals at "), line
    assert "behind the first: rank 1 " in line, line


def _sigusr1_dumps(folder: Path, sent: float) -> dict[int, dict]:
    """The dumps written because of SIGUSR1, by rank, once all three are there or the limit passed."""
    found: dict[int, dict] = {}
    while time.monotonic() - sent < DUMP_LIMIT_S and len(found) < 3:
        time.sleep(0.05)
        for path in folder.glob("rank*.json"):
            try:
                dump = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if dump.get("reason") == "SIGUSR1":
                found[dump["rank"]] = dump
    return found
