"""Repeat real multi-rank worlds many times and count hangs and aborts (issue 13's 200-run loop).

Each run is one fresh world of ``--ranks`` ranks (gloo and ccl started locally, mpi under
mpirun) executing 60 mixed collectives with distinct values per rank and element, each result
checked exactly (tests/ranks/faults.py, case ``steady``), then tearing down. Backends rotate.
A run that exceeds ``--timeout`` is a hang; one that ends with a rank error or a non-zero exit
is an abort. One JSON line per run goes to ``--out``.

    python benchmarks/multirank_loop.py --runs 200 --out benchmarks/data/multirank_loop.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from commlayer.testing import run_world


def one_run(backend: str, ranks: int, timeout: float) -> dict[str, object]:
    launcher = "mpirun" if backend == "mpi" else "local"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="commlayer-loop-") as out:
        try:
            run_world(
                "tests.ranks.faults:main",
                ranks,
                backend=None,
                timeout=timeout,
                launcher=launcher,
                args=[backend, "steady", out],
            )
            outcome = "ok"
        except AssertionError as failure:
            outcome = "hang" if "timed out after" in str(failure) else "abort"
            print(str(failure)[-3000:], file=sys.stderr, flush=True)
    return {"backend": backend, "outcome": outcome, "seconds": round(time.monotonic() - started, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--backends", default="gloo,ccl,mpi")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    backends = args.backends.split(",")
    counts: dict[str, int] = {}
    with args.out.open("a") as sink:
        for index in range(args.runs):
            record = one_run(backends[index % len(backends)], args.ranks, args.timeout)
            record["run"] = index
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            counts[str(record["outcome"])] = counts.get(str(record["outcome"]), 0) + 1
            print(f"run {index}: {record}", flush=True)
    print(f"runs {args.runs}: {counts}")


if __name__ == "__main__":
    main()
