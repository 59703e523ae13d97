"""Repeat real multi-rank tests many times and count hangs and exit aborts.

Each run is one multi-rank test (one fresh world), run by pytest (``--batch`` tests per pytest
process): the fault-injection worlds (tests/reliability/test_faults.py, tests/reliability/test_faults_defaults.py: deaths,
skipped collectives, mismatches, slow ranks, unmatched p2p, a held MASTER_PORT) on gloo, shm, ccl
and mpi, the 2-rank conformance worlds on each, and, after every ``--wide-every`` of those, the
next of the 3- and 4-rank worlds (WIDE_WORLDS: the conformance suite at 3 and 4 ranks on every
backend, mesh, parallel and hybrid-ZeRO worlds at 4 ranks, the torch-bridge worlds on shm). Both
lists are cycled in order; skipped tests (one mismatch per native backend) do not count as runs.

Outcomes: ``ok`` (pytest passed), ``hang`` (the batch ran past ``--timeout`` seconds per test: its
process group is killed, and its first test without a result is the hang), ``abort`` (a failed test
whose output shows a process that died unexpectedly: "terminate called", a core dump, a fatal
Python error; or pytest itself died of a signal), ``fail`` (any other test failure). One JSON line per run goes to ``--out``; the summary is printed at the end.

    python benchmarks/faults/repeated_tests.py --runs 200 --out loop.jsonl
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

ROOT = Path(__file__).resolve().parents[2]

FAULT_FILES = ("tests/reliability/test_faults.py", "tests/reliability/test_faults_defaults.py")
COMPAT_WORLDS = (
    "tests/facade/test_compat.py::test_compatibility_suite_on_gloo[2]",
    "tests/backends/test_shm.py::test_compatibility_suite_on_shm[2]",
    "tests/backends/test_ccl.py::test_compatibility_suite_on_ccl[2]",
    "tests/backends/test_mpi.py::test_compatibility_suite_on_mpi[2]",
)
# (test id, backend, world size): every backend at 3 and 4 ranks, the heavier worlds once each.
WIDE_WORLDS = (
    ("tests/facade/test_compat.py::test_compatibility_suite_on_gloo[3]", "gloo", 3),
    ("tests/backends/test_shm.py::test_compatibility_suite_on_shm[3]", "shm", 3),
    ("tests/backends/test_mpi.py::test_compatibility_suite_on_mpi[4]", "mpi", 4),
    ("tests/backends/test_ccl.py::test_compatibility_suite_on_ccl[3]", "ccl", 3),
    ("tests/parallel/test_mesh.py::test_each_group_all_reduce_sums_exactly_its_members", "gloo", 4),
    ("tests/backends/test_shm.py::test_compatibility_suite_on_shm[4]", "shm", 4),
    ("tests/facade/test_torch_bridge.py::test_torch_stack_matches_gloo[shm-local]", "shm", 3),
    ("tests/backends/test_mpi.py::test_compatibility_suite_on_mpi[3]", "mpi", 3),
    ("tests/backends/test_ccl.py::test_compatibility_suite_on_ccl[4]", "ccl", 4),
    ("tests/parallel/test_parallel.py::test_ulysses_and_moe_equal_single_process_on_gloo[4]", "gloo", 4),
    ("tests/facade/test_torch_bridge.py::test_torch_2d_device_mesh_on_shm_matches_gloo", "shm", 4),
    (
        "tests/zero/test_zero_hybrid.py::test_hybrid_sharding_trains_like_one_process_and_checkpoints_cross_mesh_shapes",
        "gloo",
        4,
    ),
)
_BACKENDS = ("shm", "ccl", "mpi", "gloo")
# What an unexpected abort leaves in the output (the fault cases' own deaths are expected and
# are checked by the tests themselves).
_ABORT = re.compile(r"terminate called|core dumped|Fatal Python error|Segmentation fault|double free")


def collect(python: str, wide_every: int) -> list[str]:
    """The fault suite's test ids (skipped ones drop out at run time) and the 2-rank compat worlds,
    with the next wide world after every ``wide_every`` of them (0: none)."""
    listed = subprocess.run(
        [python, "-m", "pytest", "--collect-only", "-q", *FAULT_FILES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    narrow = [line.strip() for line in listed.splitlines() if "::" in line] + list(COMPAT_WORLDS)
    if not wide_every:
        return narrow
    tests: list[str] = []
    for index, test_id in enumerate(narrow * len(WIDE_WORLDS)):  # long enough to meet every wide world
        tests.append(test_id)
        if (index + 1) % wide_every == 0:
            tests.append(WIDE_WORLDS[(index // wide_every) % len(WIDE_WORLDS)][0])
    return tests


def world_of(test_id: str) -> tuple[str, int]:
    """(backend, world size) of a test the loop runs: the wide worlds are listed, the rest have 2 ranks."""
    for wide_id, backend, size in WIDE_WORLDS:
        if wide_id == test_id:
            return backend, size
    lowered = test_id.lower()
    return next((name for name in _BACKENDS if name in lowered), "gloo"), 2


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
    parser.add_argument("--wide-every", type=int, default=5, help="2-rank runs between two wide worlds")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tests", default="", help="comma-separated test ids to cycle instead of the suite")
    args = parser.parse_args()
    tests = args.tests.split(",") if args.tests else collect(args.python, args.wide_every)
    counts: dict[str, int] = {}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs, cursor = 0, 0
    with args.out.open("a") as sink:
        while runs < args.runs:
            batch = [
                tests[(cursor + offset) % len(tests)] for offset in range(min(args.batch, args.runs - runs))
            ]
            cursor += args.batch
            for record in one_batch(args.python, batch, args.timeout):
                counted = record["outcome"] not in ("skipped", "not run")
                record["run"] = runs if counted else None
                record["backend"], record["world_size"] = world_of(str(record["test"]))
                runs += counted
                sink.write(json.dumps(record) + "\n")
                counts[str(record["outcome"])] = counts.get(str(record["outcome"]), 0) + 1
                print(f"run {record['run']}: {record['outcome']:7} {record['test']}", flush=True)
            sink.flush()
    print(f"runs {args.runs} over {len(set(tests))} tests: {counts}")


if __name__ == "__main__":
    main()
