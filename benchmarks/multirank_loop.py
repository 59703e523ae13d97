"""Repeat real multi-rank tests many times and count hangs and exit aborts (issue 13's 200-run loop).

Each run is one multi-rank test (one fresh world), run by pytest (``--batch`` tests per pytest process): the fault-injection
worlds (tests/test_faults.py, tests/test_faults_defaults.py: deaths, skipped collectives,
mismatches, slow ranks, unmatched p2p, a held MASTER_PORT) on gloo, shm, ccl and mpi, and the
compatibility worlds (the conformance suite on gloo, shm, ccl and mpi, 2 ranks). The list is
cycled in order, so a run of N covers each test about N / len(list) times; skipped tests (one
mismatch per native backend) do not count as runs.

Outcomes: ``ok`` (pytest passed), ``hang`` (the batch ran past ``--timeout`` seconds per test: its
process group is killed, and its first test without a result is the hang), ``abort`` (a failed test
whose output shows a process that died unexpectedly: "terminate called", a core dump, a fatal
Python error; or pytest itself died of a signal), ``fail`` (any other test failure). One JSON line per run goes to ``--out``; the summary is printed at the end.

    python benchmarks/multirank_loop.py --runs 200 --out benchmarks/data/multirank_loop.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAULT_FILES = ("tests/test_faults.py", "tests/test_faults_defaults.py")
COMPAT_WORLDS = (
    "tests/test_compat.py::test_compatibility_suite_on_gloo[2]",
    "tests/test_shm.py::test_compatibility_suite_on_shm[2]",
    "tests/test_ccl.py::test_compatibility_suite_on_ccl[2]",
    "tests/test_mpi_worlds.py::test_compatibility_suite_on_mpi[2]",
)
# What an unexpected abort leaves in the output (the fault cases' own deaths are expected and
# are checked by the tests themselves).
_ABORT = re.compile(r"terminate called|core dumped|Fatal Python error|Segmentation fault|double free")


def collect(python: str) -> list[str]:
    """The fault suite's test ids (skipped ones drop out at run time), then the compat worlds."""
    listed = subprocess.run(
        [python, "-m", "pytest", "--collect-only", "-q", *FAULT_FILES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    faults = [line.strip() for line in listed.splitlines() if "::" in line]
    return [*faults, *COMPAT_WORLDS]


def one_batch(python: str, test_ids: list[str], timeout_s: float) -> list[dict[str, object]]:
    """Run ``test_ids`` in one pytest process (its start-up is paid once); one record per test.

    A batch that runs past ``timeout_s`` seconds per test is killed: its first test without a
    result is the hang, the ones after it did not run.
    """
    started = time.monotonic()
    process = subprocess.Popen(
        [python, "-m", "pytest", "-v", "-p", "no:cacheprovider", *test_ids],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s * len(test_ids))
        hung = False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        hung = True
    seconds = round((time.monotonic() - started) / len(test_ids), 2)
    return _records(test_ids, output, hung, process.returncode, seconds)


def _records(
    test_ids: list[str], output: str, hung: bool, returncode: int, seconds: float
) -> list[dict[str, object]]:
    results = dict(re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR)", output, re.MULTILINE))
    records, hang_named = [], False
    for test_id in test_ids:
        result = results.get(test_id)
        if result is None:
            outcome = "not run" if hang_named or not hung else "hang"
            hang_named = hang_named or hung
        elif result in ("PASSED", "SKIPPED"):
            outcome = "ok" if result == "PASSED" else "skipped"
        else:
            outcome = "abort" if _ABORT.search(output) else "fail"
        record: dict[str, object] = {"test": test_id, "outcome": outcome, "batch_s_per_test": seconds}
        if outcome not in ("ok", "skipped", "not run"):
            record["tail"] = output[-4000:]
        records.append(record)
    if returncode is not None and returncode < 0 and not hung:
        records[-1]["outcome"] = "abort"  # pytest itself died of a signal
    return records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a run counts as a hang")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--batch", type=int, default=6, help="tests per pytest process")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tests = collect(args.python)
    counts: dict[str, int] = {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs, cursor = 0, 0
    with args.out.open("a") as sink:
        while runs < args.runs:
            batch = [tests[(cursor + offset) % len(tests)] for offset in range(args.batch)]
            cursor += args.batch
            for record in one_batch(args.python, batch, args.timeout):
                counted = record["outcome"] not in ("skipped", "not run")
                record["run"] = runs if counted else None
                runs += counted
                sink.write(json.dumps(record) + "\n")
                counts[str(record["outcome"])] = counts.get(str(record["outcome"]), 0) + 1
                print(f"run {record['run']}: {record['outcome']:7} {record['test']}", flush=True)
            sink.flush()
    print(f"runs {args.runs} over {len(tests)} tests: {counts}")


if __name__ == "__main__":
    main()
