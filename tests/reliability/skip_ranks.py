"""A rank that skips a collective: do the others name it?

``python -m tests.reliability.skip_ranks BACKEND [OP]`` forks a fresh 3-rank world (3 s group
timeout). After four exactly checked all_reduces rank 2 skips OP (all_reduce or barrier) and
waits; ranks 0 and 1 time out in it and record their error; every rank stays until both have. One JSON line per waiting rank
on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from commlayer import dist
from commlayer.ports import free_port
from tests.reliability.dead_rank_ranks import _reap

WORLD_SIZE = 3
SKIPPER = 2


def run_rank(backend: str, op: str, rank: int, port: int, out: Path) -> dict[str, Any] | None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ.update(WORLD_SIZE=str(WORLD_SIZE), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD_SIZE))
    dist.init_process_group(backend, timeout=timedelta(seconds=3))
    for step in range(4):
        tensor = torch.full((4,), float(rank + step))
        dist.all_reduce(tensor)
        assert torch.equal(tensor, torch.full((4,), float(3 * step + 3))), tensor
    if rank != SKIPPER:
        try:
            if op == "barrier":
                dist.barrier()
            else:
                dist.all_reduce(torch.ones(4))
            record = {"rank": rank, "outcome": "returned"}
        except Exception as error:  # noqa: BLE001 - the record is what the test checks
            bases = [kind.__name__ for kind in type(error).__mro__]
            record = {"rank": rank, "outcome": "error", "type": type(error).__name__, "bases": bases}
            record["message"] = str(error)
        _write(out, record)
    # Every rank stays (the store's host included) until the waiting ones have recorded.
    deadline = time.monotonic() + 60
    while not all((out / f"rank{peer}.json").exists() for peer in range(SKIPPER)):
        assert time.monotonic() < deadline, "the other ranks never recorded their outcome"
        time.sleep(0.05)
    return None


def _write(out: Path, record: dict[str, Any]) -> None:
    partial = out / f"rank{record['rank']}.tmp"
    partial.write_text(json.dumps(record))
    os.replace(partial, out / f"rank{record['rank']}.json")


def _child(backend: str, op: str, rank: int, port: int, out: Path) -> None:
    code = 0
    try:
        record = run_rank(backend, op, rank, port, out)
        if record is None:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported in the record
        record, code = {"rank": rank, "outcome": "crashed", "error": traceback.format_exc()}, 1
    if record is not None:
        _write(out, record)
    sys.stderr.flush()
    os._exit(code)


def main(backend: str, op: str) -> None:
    out = Path(tempfile.mkdtemp(prefix="skip-"))
    pids = []
    port = free_port()
    for rank in range(WORLD_SIZE):
        pid = os.fork()
        if pid == 0:
            _child(backend, op, rank, port, out)
        pids.append(pid)
    codes = _reap(pids, 90.0)
    for rank in range(WORLD_SIZE):
        path = out / f"rank{rank}.json"
        if path.exists():
            print(json.dumps({**json.loads(path.read_text()), "code": codes[rank]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "all_reduce")
