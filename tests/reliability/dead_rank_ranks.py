"""Unsupervised deaths, many worlds in one process: who do the survivors blame, and how fast?

``python -m tests.reliability.dead_rank_ranks BACKEND CYCLES`` imports torch once, then for each
cycle forks the three ranks of a fresh world (no launcher watches them). They run exactly checked
all_reduces until one rank dies (cycling through SIGKILL, sys.exit and an uncaught exception, and
through every rank, rank 0 hosting the store included); each survivor records the error it got,
then goes down on it, uncaught, as an unsupervised training script would. One JSON line per
cycle on stdout: the victim, how it died, and what each survivor said and when.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from commlayer import dist
from commlayer.core.ports import free_port
from tests.reliability.forked_worlds import reap

WORLD_SIZE = 3
DEATHS = ("sigkill", "exit", "raise")
CYCLE_LIMIT_S = 30.0


def run_rank(backend: str, rank: int, port: int, victim: int, how: str, out: Path) -> int:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(WORLD_SIZE),
    )
    dist.init_process_group(backend, timeout=timedelta(seconds=20))
    steps = 3 + victim
    for step in range(10**9):
        if rank == victim and step == steps:
            _die(how, out)
        tensor = torch.arange(8, dtype=torch.float64) + 100 * rank + step
        try:
            dist.all_reduce(tensor)
        except Exception as error:
            record = {
                "rank": rank,
                "type": type(error).__name__,
                "failed_rank": getattr(error, "failed_rank", None),
                "message": str(error)[:400],
                "t_error": time.time(),
            }
            (out / f"rank{rank}.json").write_text(json.dumps(record))
            raise
        expected = (torch.arange(8, dtype=torch.float64) + step) * WORLD_SIZE + 100 * sum(range(WORLD_SIZE))
        if not torch.equal(tensor, expected):
            raise AssertionError(f"rank {rank} step {step}: {tensor.tolist()} != {expected.tolist()}")
    return 0


def _die(how: str, out: Path) -> None:
    (out / "fault.json").write_text(json.dumps({"t_fault": time.time(), "how": how}))
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "exit":
        sys.exit(3)
    raise RuntimeError("the training step failed on this rank")


def _child(backend: str, rank: int, port: int, victim: int, how: str, out: Path) -> None:
    """A forked rank ends like a script would: an uncaught error runs the excepthook and atexit."""
    code = 0
    try:
        code = run_rank(backend, rank, port, victim, how, out)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported exactly as the interpreter would
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stderr.flush()
        os._exit(code)


def run_cycle(backend: str, index: int) -> dict[str, Any]:
    victim, how = index % WORLD_SIZE, DEATHS[index % len(DEATHS)]
    port = free_port()
    # Not a TemporaryDirectory: its exit hook would run, and remove it, in every forked rank.
    out = Path(tempfile.mkdtemp(prefix="dead-rank-"))
    try:
        pids = []
        for rank in range(WORLD_SIZE):
            pid = os.fork()
            if pid == 0:
                _child(backend, rank, port, victim, how, out)
            pids.append(pid)
        codes = reap(pids, CYCLE_LIMIT_S)
        fault = json.loads((out / "fault.json").read_text()) if (out / "fault.json").exists() else {}
        survivors = {}
        for rank in range(WORLD_SIZE):
            path = out / f"rank{rank}.json"
            if rank != victim and path.exists():
                record = json.loads(path.read_text())
                record["latency_s"] = round(record.pop("t_error") - fault.get("t_fault", 0.0), 3)
                survivors[rank] = record
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "cycle": index,
        "victim": victim,
        "how": how,
        "codes": codes,
        "pids": pids,
        "survivors": survivors,
    }


def main(backend: str, cycles: int) -> None:
    for index in range(cycles):
        try:
            print(json.dumps(run_cycle(backend, index)), flush=True)
        except Exception:  # noqa: BLE001 - the test reads the failure from stdout
            print(json.dumps({"cycle": index, "error": traceback.format_exc()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
