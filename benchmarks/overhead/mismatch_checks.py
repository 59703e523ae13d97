"""What mpi's and gloo's default mismatch checks cost per collective, against the same calls without
them and against the raw library, measured in one run.

Under mpirun, 2 ranks: ``dist.all_reduce`` (synchronous, float32, ordered mode) on a group with the
check (the default) and on one built with ``MpiOptions(verify=False)``, and mpi4py's own
``Allreduce`` on a duplicate of COMM_WORLD, at 8 B to 4 MiB. The three are interleaved in every
repeat and each figure is the median over repeats of the mean time per call (the slowest rank's);
``--iters`` calls per sample up to 64 KiB, proportionally fewer above (at least 50).

``--gloo``: 2 ranks started by ``commlayer.launch``, the same synchronous all_reduce on the gloo
world (checked, the default: on one host the signatures meet in shared memory and a blocking
call speculates, see backends/gloo_speculation.py), on a group built with
``COMMLAYER_GLOO_VERIFY=0``, torch's own ``torch.distributed.all_reduce`` on the world's
ProcessGroup (raw), and the design not taken (serial: a 32-byte reduction waited for before the
unchecked op, what a check-then-run design would cost).

    python benchmarks/overhead/mismatch_checks.py [--iters 2000] [--repeats 7] [--mpi openmpi | --gloo] [--out PATH]

prints a table, and writes the rows as JSON to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SIZES = (8, 1024, 65536, 1 << 20, 4 << 20)


def launch(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="mismatch-check-") as scratch:
        out = Path(scratch) / "rows.json"
        body = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--gloo-body" if args.gloo else "--rank-body",
            str(args.iters),
            str(args.repeats),
            str(out),
            str(args.max_bytes),
        ]
        if args.gloo:
            _launch_gloo(body)
        else:
            _launch_mpi(body, args.mpi)
        result = json.loads(out.read_text())
        if args.out is not None:
            shutil.copyfile(out, args.out)
    print(f"{result['library']}; load average {result['load']:.1f}; median of {args.repeats} repeats")
    raw = "raw torch" if args.gloo else "raw mpi4py"
    serial = f" {'serial us':>10} {'serial adds':>11}" if args.gloo else ""
    print(
        f"{'bytes':>9} {'checked us':>11} {'unchecked':>10} {raw:>11} {'check adds':>11} {'vs raw':>7}{serial}"
    )
    for row in result["rows"]:
        added = row["checked_us"] - row["unchecked_us"]
        serial = ""
        if "serial_us" in row:
            serial = f" {row['serial_us']:>10.2f} {row['serial_us'] - row['unchecked_us']:>+11.2f}"
        print(
            f"{row['bytes']:>9} {row['checked_us']:>11.2f} {row['unchecked_us']:>10.2f} {row['raw_us']:>11.2f} "
            f"{added:>+11.2f} {row['raw_us'] / row['checked_us']:>6.2f}x{serial}"
        )


def _launch_mpi(body: list[str], mpi: str) -> None:
    from commlayer.testing.mpi import mpirun_plan

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if mpi:
        env["COMMLAYER_MPI"] = mpi
    plan = mpirun_plan(2, env)
    subprocess.run([*plan.argv, *body], env=dict(plan.env), check=True)


def _launch_gloo(body: list[str]) -> None:
    from commlayer.launch import LaunchConfig, SuperviseOptions, launch

    os.environ["PYTHONPATH"] = str(ROOT)
    result = launch(LaunchConfig(tuple(body), 2, options=SuperviseOptions(timeout=600, tail_lines=20)))
    if result.exit_code != 0:
        raise SystemExit(f"gloo ranks failed: {result.summary()}")


def gloo_body(iters: int, repeats: int, out: Path, max_bytes: int) -> None:
    """One rank of ``--gloo``: checked, unchecked and raw torch all_reduce, interleaved."""
    import torch
    import torch.distributed as torch_dist

    from commlayer import dist

    dist.init_process_group("gloo")
    os.environ["COMMLAYER_GLOO_VERIFY"] = "0"  # read when a group is built
    unchecked = dist.new_group([0, 1])
    world = torch_dist.group.WORLD

    def slowest(mine: float) -> float:
        value = torch.tensor([mine], dtype=torch.float64)
        torch_dist.all_reduce(value, torch_dist.ReduceOp.MAX, group=world)
        return float(value)

    rows = []
    for size in (size for size in SIZES if size <= max_bytes):
        tensor = torch.ones(max(1, size // 4))
        variants = {
            "checked": functools.partial(dist.all_reduce, tensor),
            "unchecked": functools.partial(dist.all_reduce, tensor, group=unchecked),
            "raw": functools.partial(torch_dist.all_reduce, tensor, group=world),
            "serial": functools.partial(_serial, tensor, unchecked, world),
        }
        rows.append({"bytes": size, **_interleaved(variants, _calls(iters, size), repeats, world, slowest)})
    if dist.get_rank() == 0:
        document = {"library": f"gloo (torch {torch.__version__})", "load": os.getloadavg()[0], "rows": rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=1))
    dist.destroy_process_group()


def _serial(tensor: Any, unchecked: Any, world: Any) -> None:
    import torch
    import torch.distributed as torch_dist

    from commlayer import dist

    signature = torch.tensor((1, -1, 4, -4), dtype=torch.int64)  # what the check packs, built per call
    torch_dist.all_reduce(signature, torch_dist.ReduceOp.MAX, group=world)
    dist.all_reduce(tensor, group=unchecked)


def _calls(iters: int, size: int) -> int:
    return max(50, min(iters, iters * 65536 // size))  # large sizes: fewer calls, same accuracy


def _interleaved(variants: dict[str, Any], calls: int, repeats: int, world: Any, slowest: Any) -> dict:
    """Median over ``repeats`` of each variant's mean us per call (slowest rank), variants interleaved."""
    import torch.distributed as torch_dist

    timings: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, call in variants.items():
            for _ in range(5):
                call()
            torch_dist.barrier(group=world)
            started = time.perf_counter()
            for _ in range(calls):
                call()
            timings[name].append(slowest((time.perf_counter() - started) / calls * 1e6))
    return {f"{name}_us": statistics.median(values) for name, values in timings.items()}


def rank_body(iters: int, repeats: int, out: Path, max_bytes: int) -> None:
    import torch
    from mpi4py import MPI

    from commlayer import dist
    from commlayer.backends.mpi import MpiOptions

    dist.init_process_group("mpi")
    unchecked = dist.new_group([0, 1], pg_options=MpiOptions(verify=False))
    raw_comm = MPI.COMM_WORLD.Dup()
    rows = []
    for size in (size for size in SIZES if size <= max_bytes):
        tensor = torch.ones(max(1, size // 4))
        raw = _raw_allreduce(raw_comm, tensor, MPI)
        calls = _calls(iters, size)
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
    if len(sys.argv) > 1 and sys.argv[1] in ("--rank-body", "--gloo-body"):
        body = rank_body if sys.argv[1] == "--rank-body" else gloo_body
        body(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--mpi", default="", help="openmpi or intel-mpi (default: what mpi4py loads)")
    parser.add_argument("--gloo", action="store_true", help="gloo's check instead of mpi's (no mpirun)")
    parser.add_argument("--max-bytes", type=int, default=SIZES[-1], help="largest size timed")
    parser.add_argument("--out", type=Path, default=None, help="write the rows here as JSON")
    launch(parser.parse_args())


if __name__ == "__main__":
    main()
