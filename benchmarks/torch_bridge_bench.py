"""The torch bridge's cost, as ratios measured in one run (issue 9).

1. DDP through the bridge on mpi against DDP on torch's gloo: 2 CPU ranks, a model of many small
   buckets (one 32x32 layer per bucket), steps/s of each and their ratio.
2. The bridge's added cost per op: on a 1-rank mpi world, a 4-byte all_reduce through
   ``pg.allreduce([t], opts).wait()`` (the bridge, as DDP and functional collectives call it)
   against the commlayer backend called directly and against the facade.

    .venv/bin/python benchmarks/torch_bridge_bench.py [--json benchmarks/torch_bridge_results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as torch_dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from commlayer import dist
from commlayer.testing import run_world
from commlayer.types import ReduceOp

LAYERS = 48
WARMUP_STEPS = 5
STEPS = 30
OP_CALLS = 5000
REPEATS = 5


def ddp_rank(out_path: str) -> None:
    """One rank of the DDP run: steps/s over STEPS steps, written by rank 0."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 32) for _ in range(LAYERS)]
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*layers), process_group=dist.group.WORLD.torch_group, bucket_cap_mb=0.004
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(8, 32)
    for step in range(WARMUP_STEPS + STEPS):
        if step == WARMUP_STEPS:
            dist.barrier()
            started = time.perf_counter()
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    elapsed = time.perf_counter() - started
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps({"steps_per_s": STEPS / elapsed}))


def overhead_rank(out_path: str) -> None:
    """Per-op cost of the bridge, the facade and the backend on one rank (best of REPEATS)."""
    group = dist.group.WORLD
    backend, pg, tensor = group.primary_backend, group.torch_group, torch.ones(1)
    options = torch_dist.AllreduceOptions()
    paths = {
        "backend_direct": lambda: backend.all_reduce(tensor, ReduceOp.SUM).wait(),
        "facade": lambda: dist.all_reduce(tensor),
        "bridge_pg_allreduce": lambda: pg.allreduce([tensor], options).wait(),
        "torch_dist_all_reduce_on_bridge": lambda: torch_dist.all_reduce(tensor, group=pg),
    }
    results = {name: _best_us(call) for name, call in paths.items()}
    Path(out_path).write_text(json.dumps(results))


def _best_us(call: object) -> float:
    for _ in range(1000):
        call()  # type: ignore[operator]
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        for _ in range(OP_CALLS):
            call()  # type: ignore[operator]
        times.append((time.perf_counter() - started) / OP_CALLS * 1e6)
    return round(min(times), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here too")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        target = "benchmarks.torch_bridge_bench"
        runs = [("ddp_rank", 2, "gloo", "local", "gloo"), ("ddp_rank", 2, "mpi", "mpirun", "mpi")]
        for function, ranks, backend, launcher, name in [*runs, ("overhead_rank", 1, "mpi", "mpirun", "op")]:
            args = [str(out / f"{name}.json")]
            run_world(
                f"{target}:{function}", ranks, backend=backend, launcher=launcher, timeout=600, args=args
            )
        gloo, mpi = (json.loads((out / f"{name}.json").read_text()) for name in ("gloo", "mpi"))
        per_op = json.loads((out / "op.json").read_text())
    results = {
        "machine": os.environ.get("BENCH_MACHINE", "2-core VM, shared with other builds"),
        "ddp": {
            "ranks": 2,
            "layers": LAYERS,
            "bucket_cap_mb": 0.004,
            "gloo_steps_per_s": round(gloo["steps_per_s"], 1),
            "bridge_mpi_steps_per_s": round(mpi["steps_per_s"], 1),
            "bridge_mpi_over_gloo": round(mpi["steps_per_s"] / gloo["steps_per_s"], 2),
        },
        "per_op_us": per_op,
        "bridge_added_us_vs_backend": round(per_op["bridge_pg_allreduce"] - per_op["backend_direct"], 2),
        "bridge_added_us_vs_facade": round(per_op["bridge_pg_allreduce"] - per_op["facade"], 2),
    }
    print(json.dumps(results, indent=1))
    if options.json:
        options.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
