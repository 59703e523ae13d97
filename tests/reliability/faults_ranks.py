"""Rank body of the fault-injection suite: one fault per world, every rank records how it ended.

Started once per rank by ``tests/reliability/test_faults.py`` (plain processes for gloo and ccl, mpirun for
mpi), never through run_world, whose supervisor would stop the survivors at the first death::

    python -m tests.reliability.faults_ranks BACKEND CASE OUT_DIR

The last rank is the faulty one. Every rank writes ``OUT_DIR/rank<N>.json`` (outcome, error type
and bases, message, the rank the error names, when it happened); a dying rank first writes
``OUT_DIR/fault.json`` with the time of its fault, so the test can measure time to error. Case
``init`` only initialises: with a MASTER_PORT held by another program or a store that never
answers, each rank records its init error and when init began (``t_init``).
"""

from __future__ import annotations

import atexit
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from commlayer import dist

GROUP_TIMEOUT = timedelta(seconds=float(os.environ.get("FAULT_GROUP_TIMEOUT", "3")))
DEATHS = ("exit", "abort", "sigkill", "sigterm")
MISMATCHES = ("mismatch_size", "mismatch_dtype", "mismatch_op")
WORLD_SIZE = 2  # tests/reliability/test_faults.py's worlds


def main(backend: str, case: str, out_dir: str) -> None:
    out = Path(out_dir)
    if case == "exit_slowly" and os.environ.get("RANK") == str(WORLD_SIZE - 1):
        # Registered before init, so it runs after commlayer's exit handlers: the process then
        # outlives the group timeout after sys.exit, as a loaded machine's teardown can.
        atexit.register(time.sleep, GROUP_TIMEOUT.total_seconds() + 1.0)
    _await_every_process(out)
    started_init = time.time()
    try:
        dist.init_process_group(backend, timeout=GROUP_TIMEOUT)
    except Exception as error:  # noqa: BLE001 - the record is what the test checks
        record = {"case": case, "pid": os.getpid(), "t_init": started_init, **_describe(error)}
        _write(out / f"rank{os.environ.get('RANK', 'unknown')}.json", record)
        return
    rank, size = dist.get_rank(), dist.get_world_size()
    faulty = rank == size - 1
    record: dict[str, Any] = {"rank": rank, "case": case, "backend": backend, "faulty": faulty}
    record["pid"] = os.getpid()
    try:
        record["outcome"] = CASES[case](rank, size, faulty, out)
    except Exception as error:  # noqa: BLE001 - the record is what the test checks
        record.update(_describe(error))
    _write(out / f"rank{rank}.json", record)
    started = time.monotonic()
    dist.destroy_process_group()
    record["destroy_s"] = round(time.monotonic() - started, 3)
    _write(out / f"rank{rank}.json", record)


def _await_every_process(out: Path, limit_s: float = 120.0) -> None:
    """Start init together: under load, importing torch can take one process seconds longer than
    the other, and init's timeout is the cases' 3 s group timeout (the 200-run loop saw rank 0
    start 2.4 s after rank 1 and init fail on both)."""
    (out / f"started-{os.getpid()}").touch()
    deadline = time.monotonic() + limit_s
    while len(list(out.glob("started-*"))) < WORLD_SIZE and time.monotonic() < deadline:
        time.sleep(0.01)


def _describe(error: BaseException) -> dict[str, Any]:
    return {
        "outcome": "error",
        "type": type(error).__name__,
        "bases": [cls.__name__ for cls in type(error).__mro__],
        "message": str(error),
        "failed_rank": getattr(error, "failed_rank", None),
        "t_error": time.time(),
    }


def _write(path: Path, record: dict[str, Any]) -> None:
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(record))
    os.replace(partial, path)


def _checked_ops(rank: int, size: int, count: int, async_op: bool = False) -> None:
    """``count`` collectives with distinct values per rank and element, each checked exactly
    (``async_op``: the all_reduces are asynchronous, waited for at once)."""
    for step in range(count):
        tensor = torch.arange(4, dtype=torch.float64) + 100 * rank + step
        kind = 0 if async_op else step % 3
        if kind == 0:
            work = dist.all_reduce(tensor, async_op=async_op)
            if async_op:
                work.wait()
            expected = (torch.arange(4, dtype=torch.float64) + step) * size + 100 * sum(range(size))
        elif kind == 1:
            dist.broadcast(tensor, src=step % size)
            expected = torch.arange(4, dtype=torch.float64) + 100 * (step % size) + step
        else:
            output = torch.empty(4 * size, dtype=torch.float64)
            dist.all_gather_into_tensor(output, tensor)
            tensor = output
            expected = torch.cat([torch.arange(4, dtype=torch.float64) + 100 * r + step for r in range(size)])
        if not torch.equal(tensor, expected):
            raise AssertionError(f"silent garbage at step {step}: {tensor.tolist()} != {expected.tolist()}")


def _death(how: str, async_op: bool = False) -> Callable[[int, int, bool, Path], str]:
    def case(rank: int, size: int, faulty: bool, out: Path) -> str:
        if not faulty:
            _checked_ops(rank, size, 10**9, async_op)  # until the error
            return "returned"
        _checked_ops(rank, size, random.Random(os.environ.get("FAULT_SEED")).randint(2, 30), async_op)
        _write(out / "fault.json", {"rank": rank, "how": how, "t_fault": time.time(), "pid": os.getpid()})
        if how in ("exit", "exit_slowly"):
            sys.exit(3)
        if how == "abort":
            os.abort()
        os.kill(os.getpid(), signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
        time.sleep(60)
        return "survived its own death"

    return case


def _await_peers(out: Path, size: int, limit_s: float = 60.0) -> None:
    """The faulty rank of a non-fatal case waits until every other rank recorded its outcome."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all((out / f"rank{rank}.json").exists() for rank in range(max(1, size - 1))):
            return
        time.sleep(0.05)


def _skipped(collective: Callable[[int], object]) -> Callable[[int, int, bool, Path], str]:
    """The faulty rank never calls ``collective(size)``, which its peers wait in."""

    def case(rank: int, size: int, faulty: bool, out: Path) -> str:
        _checked_ops(rank, size, 4)
        if faulty:
            _write(
                out / "fault.json", {"rank": rank, "how": "skip", "t_fault": time.time(), "pid": os.getpid()}
            )
            _await_peers(out, size)
            return "skipped"
        collective(size)
        return "returned"

    return case


def skipped_barrier(rank: int, size: int, faulty: bool, out: Path) -> str:
    _checked_ops(rank, size, 2)
    if faulty:
        _write(
            out / "fault.json",
            {"rank": rank, "how": "skip barrier", "t_fault": time.time(), "pid": os.getpid()},
        )
        _await_peers(out, size)
        return "skipped"
    dist.barrier()
    return "returned"


def steady(rank: int, size: int, faulty: bool, out: Path) -> str:
    """No fault: the repeated-run loop's body (benchmarks/faults/repeated_tests.py)."""
    _checked_ops(rank, size, 60)
    return "returned"


def slow_rank(rank: int, size: int, faulty: bool, out: Path) -> str:
    """Late by half the group timeout: everyone must still finish with exact results."""
    _checked_ops(rank, size, 3)
    if faulty:
        time.sleep(GROUP_TIMEOUT.total_seconds() / 2)
    _checked_ops(rank, size, 6)
    return "returned"


def unmatched_recv(rank: int, size: int, faulty: bool, out: Path) -> str:
    if rank == 0:
        _write(
            out / "fault.json",
            {"rank": size - 1, "how": "never sends", "t_fault": time.time(), "pid": os.getpid()},
        )
        dist.recv(torch.zeros(4), src=size - 1)
        return "returned"
    _await_peers(out, 1)  # rank 0's record: it gave up on the receive
    return "returned"


def _mismatch(kind: str, async_op: bool = False) -> Callable[[int, int, bool, Path], str]:
    def case(rank: int, size: int, faulty: bool, out: Path) -> str:
        _checked_ops(rank, size, 3)
        if faulty:
            _write(
                out / "fault.json", {"rank": rank, "how": kind, "t_fault": time.time(), "pid": os.getpid()}
            )
        tensor = torch.arange(4, dtype=torch.float32) + 10 * rank
        expected = (torch.arange(4, dtype=torch.float32) * size) + 10 * sum(range(size))
        if faulty and kind == "mismatch_size":
            tensor = torch.arange(8, dtype=torch.float32)
        if faulty and kind == "mismatch_dtype":
            tensor = tensor.to(torch.int32)
        if faulty and kind == "mismatch_op":
            dist.broadcast(tensor, src=0)
        elif async_op:
            dist.all_reduce(tensor, async_op=True).wait()
        else:
            dist.all_reduce(tensor)
        if tensor.numel() == 4 and not torch.equal(tensor.float(), expected):
            raise AssertionError(f"silent garbage: {tensor.tolist()} != {expected.tolist()}")
        return "returned"

    return case


CASES: dict[str, Callable[[int, int, bool, Path], str]] = {
    **{how: _death(how) for how in DEATHS},
    "sigkill_async": _death("sigkill", async_op=True),
    "exit_slowly": _death("exit_slowly"),
    **{kind: _mismatch(kind) for kind in MISMATCHES},
    "mismatch_dtype_async": _mismatch("mismatch_dtype", async_op=True),
    "skip": _skipped(lambda size: dist.all_reduce(torch.ones(4))),
    # On mpi the waiting ranks enter reduce_scatter_tensor before the missing peer's signature
    # (the check's speculation), so the wait they are left in is MPI's own.
    "skip_speculated": _skipped(
        lambda size: dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * size))
    ),
    "skip_barrier": skipped_barrier,
    "slow": slow_rank,
    "steady": steady,
    "unmatched_recv": unmatched_recv,
    "init": lambda rank, size, faulty, out: "returned",
}


if __name__ == "__main__":
    main(*sys.argv[1:4])
