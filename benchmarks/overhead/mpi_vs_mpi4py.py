"""commlayer's mpi backend against raw mpi4py, and against torch's gloo, in the same mpirun job.

One command launches every job (world sizes x MPI launcher/library pairs) and prints the tables::

    python benchmarks/overhead/mpi_vs_mpi4py.py --world-sizes 2,4 --pairs default,openmpi --out results.json
    python benchmarks/overhead/mpi_vs_mpi4py.py --render benchmarks/data/mpi_ordered_default/vm.json   # the tables again

Each job runs this file under mpirun (the pair's launcher, from commlayer.testing.mpirun_plan) and
measures all_reduce (SUM, float32, in place), all_gather and reduce_scatter (one tensor each),
broadcast and all_to_all (equal splits) at 8 B .. 64 MiB per rank, interleaved round by round so
drift hits every variant alike:

    raw           mpi4py Allreduce / Allgather / Reduce_scatter_block / Bcast / Alltoall on numpy views
                  of the variants' own tensors (the reference: MPI's blocking calls, same memory)
    control       raw again, timed as a variant: the method's own noise floor (raw/control ~ 1)
    mpi           commlayer.dist on the mpi backend, CPU tensors, synchronous, default options
                  (ordered mode: MPI's blocking call, made in place)
    mpi-unchecked the same on a group with MpiOptions(verify=False): no cross-rank mismatch check
                  (one small Allreduce before each collective by default), i.e. the dispatch alone
    mpi-requests  the same on a group with MpiOptions("requests"): MPI's non-blocking collective
                  (Iallreduce, ...) and the backend's wait, the default before ordered mode
    gloo          torch.distributed on gloo, rendezvoused in the same job

Times are the slowest rank's, per op, in the best of the rounds (load from other processes on a
shared host only ever adds time); the JSON also keeps the median. Before timing, each variant's
result is checked exactly once per op and size. Every variant and raw run on the same tensors, so
allocation, alignment, huge pages and cache state are the same on both sides of a ratio.

Ratios against raw come from many short rounds: every round times each variant right beside a
batch of raw (raw first in even rounds, second in odd ones). ``raw/x`` is the mean of raw's fastest
half of those batches over the mean of the variant's fastest half (``fast_ratio``): interference
on a shared host only ever adds time to a batch, so the slow half is where the noise lives, while
the fastest half still averages many batches (a single best batch is one lucky draw). The median
over rounds of the per-round ratio is kept as ``raw_ratio``. On a 2-core host a preemption, or
the hypervisor moving a virtual CPU, slows one batch several-fold for milliseconds; best-of times
from different rounds compare different machine states, and a single-run ratio moved by up to
0.3 between two runs. ``control`` (raw timed as a variant) shows what the method reads where
there is no difference at all.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mpi_report import OPS, Record, machine, read_results, render, write_results

REPO = Path(__file__).resolve().parents[2]
SIZES = [8 << (2 * step) for step in range(12)] + [1 << 20, 64 << 20]  # 8 B, 32 B, ... 32 MiB, 1 MiB, 64 MiB
VARIANTS = ("raw", "mpi", "mpi-unchecked", "mpi-requests", "gloo", "control")
PAIRS = {"default": {}, "openmpi": {"COMMLAYER_MPI": "openmpi"}}
_JOB_DEFAULTS = {
    # Unpinned ranks, as Open MPI's plan already runs them (--bind-to none): Intel MPI pins each
    # rank to one core, where gloo's helper threads then starve behind the rank.
    "I_MPI_PIN": "0",
    # numpy asks for transparent huge pages on large arrays, torch's CPU allocator only with this
    # set; without it, MPI on a 64 MiB tensor ran ~2.5x slower than on a numpy array here (TLB
    # misses in the shared-memory copies), whatever the dispatch path.
    "THP_MEM_ALLOC_ENABLE": "1",
}


# --- inside one mpirun job -------------------------------------------------------------------


def run_job(
    rounds: int, budget_s: float, max_bytes: int, min_bytes: int = 0, variants: tuple[str, ...] = VARIANTS
) -> list[Record]:
    import torch
    import torch.distributed as torch_dist
    from mpi4py import MPI
    from torch_vs_commlayer import fastest_half_mean

    from commlayer import dist
    from commlayer.backends.mpi import MpiOptions

    dist.init_process_group("mpi", timeout=timedelta(minutes=10), pg_options=MpiOptions())
    comm, backend = MPI.COMM_WORLD.Dup(), dist.group.WORLD.primary_backend
    requests = dist.new_group(list(range(comm.size)), pg_options=MpiOptions("requests"))
    unchecked = dist.new_group(list(range(comm.size)), pg_options=MpiOptions(verify=False))
    torch_dist.init_process_group("gloo", store=_gloo_store(comm), rank=comm.rank, world_size=comm.size)
    records = []
    for nbytes in sorted(size for size in set(SIZES) if min_bytes <= size <= max_bytes):
        for op in OPS:
            cases = _cases(op, nbytes, comm, torch, torch_dist, dist, MPI, requests, unchecked)
            cases = {name: case for name, case in cases.items() if name == "raw" or name in variants}
            for _run, check in cases.values():
                check()
            pairs = _measure(cases, comm, MPI, rounds, budget_s)
            records += [
                Record(
                    op,
                    nbytes,
                    name,
                    min(mine),
                    statistics.median(mine),
                    comm.size,
                    backend.library,
                    statistics.median(raw / own for raw, own in zip(raws, mine)),
                    fastest_half_mean(raws) / fastest_half_mean(mine),
                )
                for name, (raws, mine) in pairs.items()
            ]
        if comm.rank == 0:
            print(f"# done {nbytes} B", file=sys.stderr, flush=True)
    torch_dist.destroy_process_group()
    dist.destroy_process_group()
    return records


def _cases(
    op: str,
    nbytes: int,
    comm: Any,
    torch: Any,
    torch_dist: Any,
    dist: Any,
    mpi: Any,
    requests: Any,
    unchecked: Any,
) -> dict[str, tuple[Callable[[], Any], Callable[[], None]]]:
    """variant -> (one timed op, one exact check); every variant has its own buffers."""
    count, size, rank = nbytes // 4, comm.size, comm.rank
    source, target = _BUFFERS[op]
    lengths = {"small": count, "big": count * size, "spread": count * size}
    facade = {
        "all_reduce": lambda i, o, group=None: dist.all_reduce(i, group=group),
        "all_gather": lambda i, o, group=None: dist.all_gather_into_tensor(o, i, group=group),
        "reduce_scatter": lambda i, o, group=None: dist.reduce_scatter_tensor(o, i, group=group),
        "broadcast": lambda i, o, group=None: dist.broadcast(i, src=0, group=group),
        "all_to_all": lambda i, o, group=None: dist.all_to_all_single(o, i, group=group),
    }[op]
    gloo = {
        "all_reduce": lambda i, o: torch_dist.all_reduce(i),
        "all_gather": lambda i, o: torch_dist.all_gather_into_tensor(o, i),
        "reduce_scatter": lambda i, o: torch_dist.reduce_scatter_tensor(o, i),
        "broadcast": lambda i, o: torch_dist.broadcast(i, src=0),
        "all_to_all": lambda i, o: torch_dist.all_to_all_single(o, i),
    }[op]
    # One set of tensors for every variant, raw included (their numpy views): same memory, same pages.
    tensor_in = torch.zeros(lengths[source])
    tensor_out = tensor_in if target == source else torch.zeros(lengths[target])
    raw_in, raw_out = tensor_in.numpy(), tensor_out.numpy()
    raw = {
        "all_reduce": lambda: comm.Allreduce(mpi.IN_PLACE, raw_in),
        "all_gather": lambda: comm.Allgather(raw_in, raw_out),
        "reduce_scatter": lambda: comm.Reduce_scatter_block(raw_in, raw_out),
        "broadcast": lambda: comm.Bcast(raw_in, 0),
        "all_to_all": lambda: comm.Alltoall(raw_in, raw_out),
    }[op]
    raw_check = _checker(op, raw_in, raw_out, lambda i, o: raw(), rank, size, count)
    variants = {"raw": (raw, raw_check), "control": (raw, raw_check)}
    for name, call in (
        ("mpi", facade),
        ("mpi-unchecked", functools.partial(facade, group=unchecked)),
        ("mpi-requests", functools.partial(facade, group=requests)),
        ("gloo", gloo),
    ):
        variants[name] = (
            lambda call=call, i=tensor_in, o=tensor_out: call(i, o),
            _checker(
                op,
                tensor_in.numpy(),
                tensor_out.numpy(),
                lambda i, o, c=call, ti=tensor_in, to=tensor_out: c(ti, to),
                rank,
                size,
                count,
            ),
        )
    return variants


# op -> (input buffer, output buffer): "small" holds S bytes, "big" and "spread" S bytes per rank.
_BUFFERS = {
    "all_reduce": ("small", "small"),
    "broadcast": ("small", "small"),
    "all_gather": ("small", "big"),
    "reduce_scatter": ("big", "small"),
    "all_to_all": ("big", "spread"),
}


def _checker(
    op: str, source: Any, target: Any, call: Callable[[Any, Any], Any], rank: int, size: int, count: int
) -> Callable[[], None]:
    """Fill ``source`` with this rank's values, run once, compare ``target`` exactly, zero both."""
    import numpy as np

    def check() -> None:
        source[:] = _values(np, source.size, rank)
        call(source, target)
        if not np.array_equal(target, _expected(np, op, rank, size, count)):
            raise AssertionError(f"{op} of {count * 4} B on rank {rank}: wrong result")
        source[:] = 0
        target[:] = 0

    return check


def _values(np: Any, length: int, rank: int) -> Any:
    return (np.arange(length) % 97 + 1000 * rank).astype(np.float32)


def _expected(np: Any, op: str, rank: int, size: int, count: int) -> Any:
    base = np.arange(count * size) % 97
    mine = base[rank * count : (rank + 1) * count]
    if op == "all_reduce":
        return (base[:count] * size + 1000 * sum(range(size))).astype(np.float32)
    if op == "broadcast":
        return base[:count].astype(np.float32)
    if op == "all_gather":
        return np.concatenate([base[:count] + 1000 * peer for peer in range(size)]).astype(np.float32)
    if op == "reduce_scatter":
        return (mine * size + 1000 * sum(range(size))).astype(np.float32)
    return np.concatenate([mine + 1000 * peer for peer in range(size)]).astype(np.float32)


def _measure(
    cases: dict[str, Any], comm: Any, mpi: Any, rounds: int, budget_s: float
) -> dict[str, tuple[list[float], list[float]]]:
    """Per variant: (raw's, the variant's) seconds per op of the slowest rank, one pair per round.

    ``raw`` itself gets all of raw's batches on both sides.
    """
    others = [name for name in cases if name != "raw"]
    share = budget_s / (rounds * 2 * len(others))
    iterations = {name: _iterations(run, comm, mpi, share) for name, (run, _check) in cases.items()}
    pairs: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in others}
    for round_index in range(rounds):
        # Rotate the order, so no variant always runs right after the same other one.
        shift = round_index % len(others)
        for name in others[shift:] + others[:shift]:
            order = ("raw", name) if round_index % 2 == 0 else (name, "raw")
            timed = {side: _timed_batch(cases[side][0], iterations[side], comm, mpi) for side in order}
            pairs[name][0].append(timed["raw"])
            pairs[name][1].append(timed[name])
    every_raw = [seconds for raws, _ in pairs.values() for seconds in raws]
    return {"raw": (every_raw, every_raw), **pairs}


def _timed_batch(run: Callable[[], Any], iterations: int, comm: Any, mpi: Any) -> float:
    """Seconds per op of the slowest rank over one batch, ranks lined up by a barrier first."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        run()
    return comm.allreduce((time.perf_counter() - start) / iterations, op=mpi.MAX)


def _iterations(run: Callable[[], Any], comm: Any, mpi: Any, budget_s: float) -> int:
    """How many ops of this variant fit its budget, judged from the slowest rank; at least 2."""
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(3):
        run()
    once = comm.allreduce((time.perf_counter() - start) / 3, op=mpi.MAX)
    return max(2, min(20_000, int(budget_s / max(once, 1e-7))))


def _gloo_store(comm: Any) -> Any:
    """A TCPStore for torch's gloo, at an address and port rank 0 picks and broadcasts over MPI."""
    import torch.distributed as torch_dist

    from commlayer.core.ports import free_port

    port = comm.bcast(free_port() if comm.rank == 0 else None, root=0)
    return torch_dist.TCPStore(
        "127.0.0.1", port, comm.size, is_master=comm.rank == 0, timeout=timedelta(minutes=5)
    )


# --- the driver ------------------------------------------------------------------------------


def launch_jobs(arguments: argparse.Namespace, scratch: Path) -> list[Record]:
    from commlayer.launch import ProcessSpec, SuperviseOptions, supervise
    from commlayer.testing import mpirun_plan

    records: list[Record] = []
    for pair in arguments.pairs.split(","):
        for world_size in (int(size) for size in arguments.world_sizes.split(",")):
            output = scratch / f"mpi_{pair}_{world_size}.json"
            env = {
                **_JOB_DEFAULTS,
                **os.environ,
                **PAIRS[pair],
                "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
            }
            plan = mpirun_plan(world_size, env)
            job = (
                *plan.argv,
                sys.executable,
                __file__,
                "--job",
                str(output),
                "--rounds",
                str(arguments.rounds),
                "--budget",
                str(arguments.budget),
                "--max-bytes",
                str(arguments.max_bytes),
                "--min-bytes",
                str(arguments.min_bytes),
                "--variants",
                arguments.variants,
            )
            options = SuperviseOptions(
                timeout=arguments.timeout, echo=True, forward_signals=True, kill_grace=2.0
            )
            result = supervise([ProcessSpec(f"mpirun {pair} x{world_size}", job, plan.env)], options)
            if result.exit_code != 0:
                raise SystemExit(
                    f"mpi_vs_mpi4py: the {pair} job at {world_size} ranks failed ({result.summary('mpi_bench')})"
                )
            records += [Record(**row) for row in json.loads(output.read_text())["records"]]
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument(
        "--pairs", default="default,openmpi", help=f"launcher/library pairs: {', '.join(PAIRS)}"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the records here as JSON")
    parser.add_argument("--render", type=Path, help="print the tables of a results file and exit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--budget", type=float, default=3.0, help="seconds per (op, size) across variants and rounds"
    )
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--min-bytes", type=int, default=0)
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="which to time beside raw (gloo and mpi-requests take most of a large-message run)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per mpirun job")
    parser.add_argument("--job", type=Path, help=argparse.SUPPRESS)  # set when running inside mpirun
    arguments = parser.parse_args()
    if arguments.job is not None:
        variants = tuple(arguments.variants.split(","))
        records = run_job(
            arguments.rounds, arguments.budget, arguments.max_bytes, arguments.min_bytes, variants
        )
        if int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0"))) == 0:
            payload = {"machine": machine(), "records": [asdict(record) for record in records]}
            arguments.job.write_text(json.dumps(payload, indent=1))
        return
    if arguments.render is not None:
        print("\n".join(render(records) for records in read_results(arguments.render)))
        return
    with tempfile.TemporaryDirectory(prefix="mpi-bench-") as scratch:
        records = launch_jobs(arguments, Path(scratch))
    if arguments.out is not None:
        write_results(arguments.out, records, " ".join(["python", *sys.argv]))
    print(f"machine: {machine()}")
    print(render(records))


if __name__ == "__main__":
    main()
