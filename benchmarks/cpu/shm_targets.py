"""shm's goals, read off one ``commlayer bench --json`` file of all_reduce records.

    python benchmarks/cpu/shm_targets.py 2ranks.json
    python benchmarks/cpu/shm_targets.py benchmarks/data/cpu_collectives/vm.json --run "4 ranks"

One row per size: shm's time against raw mpi4py's (goal: <= 1.0 from 8 B to 64 KiB), shm's
speed-up over gloo (goal: >= 100x up to 64 KiB), shm's busbw against raw mpi4py's (goal: >= 1.0
from 64 KiB to 64 MiB) and against one memcpy's bandwidth measured in the same run. A goal missed
is marked with ``!``; every row also says whether any backend returned a wrong element.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import json

from commlayer.bench.records import BenchRecord

SMALL_LIMIT = 64 * 1024  # latency goals up to here, busbw goals from here


def goal_rows(records: list[BenchRecord]) -> list[str]:
    """The table's lines: a header, then one line per size that shm and mpi4py both measured."""
    table = {(record.backend, record.bytes): record for record in records if record.op == "all_reduce"}
    lines = [
        "| bytes | shm us | mpi4py us | shm/mpi4py time | shm/gloo speed-up | shm/mpi4py busbw | shm/memcpy bw |"
    ]
    lines.append("|" + "---|" * 7)
    for nbytes in sorted({size for backend, size in table if backend == "shm"}):
        shm, raw = table.get(("shm", nbytes)), table.get(("mpi4py", nbytes))
        if shm is None or raw is None:
            continue
        gloo, copy = table.get(("gloo", nbytes)), table.get(("memcpy", nbytes))
        small = nbytes <= SMALL_LIMIT
        time_ratio = shm.time_us / raw.time_us
        speedup = gloo.time_us / shm.time_us if gloo else float("nan")
        busbw_ratio = shm.busbw_gbps / raw.busbw_gbps
        cells = [
            str(nbytes),
            f"{shm.time_us:.2f}",
            f"{raw.time_us:.2f}",
            _mark(f"{time_ratio:.2f}", small and time_ratio > 1.0),
            _mark(f"{speedup:.0f}x", small and speedup < 100),
            _mark(f"{busbw_ratio:.2f}", nbytes >= SMALL_LIMIT and busbw_ratio < 1.0),
            f"{shm.busbw_gbps / copy.busbw_gbps:.2f}" if copy else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    wrong = sum(record.wrong for record in records)
    lines.append(f"\nwrong elements over every backend and size: {wrong}")
    return lines


def _mark(cell: str, missed: bool) -> str:
    return cell + " !" if missed else cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", type=Path, help="records written by commlayer bench --json")
    parser.add_argument("--run", default="2 ranks", help="the run to read in a file of several runs")
    args = parser.parse_args()
    document = json.loads(args.json.read_text())
    if isinstance(document, dict) and "records" in document:  # one commlayer bench file: metadata, records
        document = document["records"]
    rows = document["runs"][args.run] if isinstance(document, dict) else document
    print("\n".join(goal_rows([BenchRecord(**row) for row in rows])))


if __name__ == "__main__":
    main()
