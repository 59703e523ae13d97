"""Unsupervised worlds for the fault tests: ranks forked from one process, with no launcher to
stop them, so each survivor must end by itself, exactly as a script would without ``commlayer run``.

The rank side (:func:`run_forked`) forks the ranks, reaps them under a deadline and prints one JSON
record per rank; the test side (:func:`forked_records`) runs such a module in a clean environment
and returns the records by rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commlayer.testing.fork_server import warm_command

ROOT = Path(__file__).resolve().parents[2]
# Variables of an enclosing launcher that would leak into the forked world's own rendezvous.
_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COMMLAYER_DEBUG")

Record = dict[str, Any]


def run_forked(
    world_size: int, rank_body: Callable[[int, Path], Record | None], limit_s: float = 90.0
) -> None:
    """Fork ``world_size`` ranks running ``rank_body(rank, folder)``; print each rank's record with its exit code."""
    out = Path(tempfile.mkdtemp(prefix="forked-world-"))
    pids = []
    for rank in range(world_size):
        pid = os.fork()
        if pid == 0:
            _child(rank, out, rank_body)
        pids.append(pid)
    codes = reap(pids, limit_s)
    for rank in range(world_size):
        path = out / f"rank{rank}.json"
        if path.exists():
            print(json.dumps({**json.loads(path.read_text()), "code": codes[rank]}), flush=True)


def reap(pids: list[int], limit_s: float) -> list[int | None]:
    """Each child's exit code, or None for one still running at the deadline (then SIGKILLed)."""
    codes: dict[int, int | None] = {}
    deadline = time.monotonic() + limit_s
    while len(codes) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    for pid in pids:
        if pid not in codes:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            codes[pid] = None
    return [codes[pid] for pid in pids]


def write_record(out: Path, record: Record) -> None:
    """Publish ``record`` (which names its ``rank``) whole: readers never see half a file."""
    partial = out / f"rank{record['rank']}.tmp"
    partial.write_text(json.dumps(record))
    os.replace(partial, out / f"rank{record['rank']}.json")


def forked_records(module: str, *args: str, timeout: float = 120.0) -> tuple[dict[int, Record], str]:
    """Run ``python -m module args`` in a clean environment (warm-started, see
    :mod:`commlayer.testing.fork_server`): its records by rank, and its output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    for name in _LAUNCHER_VARIABLES:
        env.pop(name, None)
    done = subprocess.run(
        warm_command([sys.executable, "-m", module, *args], env),
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    records = {record["rank"]: record for record in map(json.loads, lines)}
    return records, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


def _child(rank: int, out: Path, rank_body: Callable[[int, Path], Record | None]) -> None:
    code = 0
    try:
        record = rank_body(rank, out)
    except BaseException:  # noqa: BLE001 - reported in the record
        record, code = {"rank": rank, "outcome": "crashed", "error": traceback.format_exc()}, 1
    if record is not None:
        write_record(out, record)
    sys.stderr.flush()
    os._exit(code)
