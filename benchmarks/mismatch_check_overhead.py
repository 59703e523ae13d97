"""What mpi's default mismatch check costs per collective, against the same calls without it and
against raw mpi4py, measured in one run.

Under mpirun, 2 ranks: ``dist.all_reduce`` (synchronous, float32, ordered mode) on a group with the
check (the default) and on one built with ``MpiOptions(verify=False)``, and mpi4py's own
``Allreduce`` on a duplicate of COMM_WORLD, at 8 B to 4 MiB. The three are interleaved in every
repeat and each figure is the median over repeats of the mean time per call (the slowest rank's);
``--iters`` calls per sample up to 64 KiB, proportionally fewer above (at least 50).

    python benchmarks/mismatch_check_overhead.py [--iters 2000] [--repeats 7] [--mpi openmpi]

writes benchmarks/data/mismatch_check_overhead_<mpi or default>.json and prints a table.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = (8, 1024, 65536, 1 << 20, 4 << 20)
DATA = ROOT / "benchmarks" / "data"


def launch(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from commlayer.testing.mpi import mpirun_plan

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if args.mpi:
        env["COMMLAYER_MPI"] = args.mpi
    plan = mpirun_plan(2, env)
    out = DATA / f"mismatch_check_overhead_{args.mpi or 'default'}.json"
    body = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--rank-body",
        str(args.iters),
        str(args.repeats),
        str(out),
    ]
    subprocess.run([*plan.argv, *body], env=dict(plan.env), check=True)
    result = json.loads(out.read_text())
    print(f"{result['library']}; load average {result['load']:.1f}; median of {args.repeats} repeats")
    print(
        f"{'bytes':>9} {'checked us':>11} {'unchecked':>10} {'raw mpi4py':>11} {'check adds':>11} {'vs raw':>7}"
    )
    for row in result["rows"]:
        added = row["checked_us"] - row["unchecked_us"]
        print(
            f"{row['bytes']:>9} {row['checked_us']:>11.2f} {row['unchecked_us']:>10.2f} {row['raw_us']:>11.2f} "
            f"{added:>+11.2f} {row['raw_us'] / row['checked_us']:>6.2f}x"
        )


def rank_body(iters: int, repeats: int, out: Path) -> None:
    import torch
    from mpi4py import MPI

    from commlayer import dist
    from commlayer.backends.mpi import MpiOptions

    dist.init_process_group("mpi")
    unchecked = dist.new_group([0, 1], pg_options=MpiOptions(verify=False))
    raw_comm = MPI.COMM_WORLD.Dup()
    rows = []
    for size in SIZES:
        tensor = torch.ones(max(1, size // 4))
        raw = _raw_allreduce(raw_comm, tensor, MPI)
        calls = max(50, min(iters, iters * 65536 // size))  # large sizes: fewer calls, same accuracy
        timings: dict[str, list[float]] = {"checked": [], "unchecked": [], "raw": []}
        variants = {
            "checked": functools.partial(dist.all_reduce, tensor),
            "unchecked": functools.partial(dist.all_reduce, tensor, group=unchecked),
            "raw": raw,
        }
        for _ in range(repeats):
            for name, call in variants.items():
                timings[name].append(_per_call(call, calls, raw_comm, MPI))
        rows.append({"bytes": size, **{f"{name}_us": statistics.median(v) for name, v in timings.items()}})
    if dist.get_rank() == 0:
        document = {
            "library": MPI.Get_library_version().replace("\x00", "").splitlines()[0],
            "load": os.getloadavg()[0],
            "rows": rows,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=1))
    dist.destroy_process_group()


def _raw_allreduce(comm: Any, tensor: Any, mpi: Any) -> Any:
    buffer = [mpi.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes), mpi.FLOAT]
    return lambda: comm.Allreduce(mpi.IN_PLACE, buffer, mpi.SUM)


def _per_call(call: Any, iters: int, comm: Any, mpi: Any) -> float:
    """Mean microseconds per call on the slowest rank (after a barrier and a few warm-up calls)."""
    for _ in range(5):
        call()
    comm.Barrier()
    started = time.perf_counter()
    for _ in range(iters):
        call()
    mine = (time.perf_counter() - started) / iters * 1e6
    return comm.allreduce(mine, op=mpi.MAX)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-body":
        rank_body(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--mpi", default="", help="openmpi or intel-mpi (default: what mpi4py loads)")
    launch(parser.parse_args())


if __name__ == "__main__":
    main()
