"""The torch bridge's cost, as ratios and differences measured in one run.

1. DDP, 2 CPU ranks (one compute thread each), a model of many small buckets (48 Linear layers,
   one bucket each), steps/s of: torch's gloo; mpi through the bridge with futures completed in
   the background; and with ``COMMLAYER_BRIDGE_FUTURES=inline`` (each bucket's future completed by
   DDP's thread when it asks for it: buckets cannot overlap backward). ``auto_mode`` is what the
   default picks on this machine; ``in_flight`` is the share of buckets whose future was still
   pending when DDP got it: the buckets that overlapped the rest of backward.
2. The bridge's added cost per 4-byte all_reduce against the commlayer backend called directly
   and against the facade, with the bridge's own steps timed one by one (see ``torch_bridge_costs``):
   on a null backend in this process (Python only) and on a 1-rank mpi world.

    .venv/bin/python benchmarks/overhead/torch_bridge.py [--json benchmarks/data/torch_bridge/vm.json]
    .venv/bin/python benchmarks/overhead/torch_bridge.py --width 256 --batch 64  # more compute per bucket
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from torch_bridge_costs import stand_in_costs

from commlayer import dist
from commlayer.core.work import Work
from commlayer.facade.torch_bridge import work as torch_bridge_work
from commlayer.testing import run_world

LAYERS = 48
WARMUP_STEPS = 5
STEPS = 30
OP_CALLS = 5000
REPEATS = 7
# name -> (backend, launcher, how the bridge completes futures)
DDP_RUNS = {
    "gloo": ("gloo", "local", "background"),
    "bridge_mpi": ("mpi", "mpirun", "background"),
    "bridge_mpi_futures_inline": ("mpi", "mpirun", "inline"),
}


def ddp_rank(out_path: str, width: str, batch_size: str, steps: str = str(STEPS)) -> None:
    """One rank of a DDP run: steps/s over ``steps`` timed steps, written by rank 0."""
    pending = _count_pending_futures()
    torch.set_num_threads(1)  # two ranks on two cores: one compute thread each, for every variant
    torch.manual_seed(0)
    layers = [torch.nn.Linear(int(width), int(width)) for _ in range(LAYERS)]
    bucket_cap_mb = int(width) ** 2 * 4 / 2**20  # one bucket per layer
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*layers), process_group=dist.group.WORLD.torch_group, bucket_cap_mb=bucket_cap_mb
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(int(batch_size), int(width))
    for step in range(WARMUP_STEPS + int(steps)):
        if step == WARMUP_STEPS:
            dist.barrier()
            started = time.perf_counter()
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    elapsed = time.perf_counter() - started
    if dist.get_rank() == 0:
        in_flight = pending[0] / pending[1] if pending[1] else None
        auto_inline = torch_bridge_work.inline_futures({**os.environ, torch_bridge_work.FUTURES_ENV: "auto"})
        result = {
            "steps_per_s": int(steps) / elapsed,
            "in_flight": in_flight,
            "auto_picks_inline": auto_inline,
        }
        Path(out_path).write_text(json.dumps(result))


def _count_pending_futures() -> list[int]:
    """[pending, total] of the futures the bridge hands out, counted as DDP gets them."""
    counts = [0, 0]
    future_of = torch_bridge_work.Completer.future_of

    def counted(completer: torch_bridge_work.Completer, work: Work, result: list) -> torch.futures.Future:
        future = future_of(completer, work, result)
        counts[0] += not future.done()
        counts[1] += 1
        return future

    torch_bridge_work.Completer.future_of = counted  # type: ignore[method-assign]
    return counts


def _ddp(out: Path, width: int, batch_size: int, steps: int) -> dict:
    runs = {}
    for name, (backend, launcher, futures) in DDP_RUNS.items():
        path = out / f"{name}.json"
        target = "benchmarks.torch_bridge_bench:ddp_rank"
        args = [str(path), str(width), str(batch_size), str(steps)]
        env = {torch_bridge_work.FUTURES_ENV: futures}
        run_world(target, 2, backend=backend, launcher=launcher, timeout=600, env=env, args=args)
        runs[name] = json.loads(path.read_text())
    gloo = runs["gloo"]["steps_per_s"]
    summary = {
        "ranks": 2,
        "layers": f"{LAYERS} x Linear({width}, {width}), one bucket each",
        "batch": batch_size,
        **{f"{name}_steps_per_s": round(run["steps_per_s"], 1) for name, run in runs.items()},
        "bridge_mpi_in_flight": runs["bridge_mpi"]["in_flight"],
        "bridge_mpi_auto_mode": "inline" if runs["bridge_mpi"]["auto_picks_inline"] else "background",
        "bridge_mpi_over_gloo": round(runs["bridge_mpi"]["steps_per_s"] / gloo, 2),
        "bridge_mpi_over_futures_inline": round(
            runs["bridge_mpi"]["steps_per_s"] / runs["bridge_mpi_futures_inline"]["steps_per_s"], 2
        ),
    }
    return summary


def _mpi_costs(out: Path, calls: int, repeats: int) -> dict:
    path = out / "op.json"
    target = "torch_bridge_costs:mpi_rank"
    args = [str(path), str(calls), str(repeats)]
    run_world(target, 1, backend="mpi", launcher="mpirun", timeout=600, args=args)
    return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--skip-ddp", action="store_true", help="only the per-op part")
    parser.add_argument("--width", type=int, default=32, help="DDP: features of each Linear layer")
    parser.add_argument("--batch", type=int, default=8, help="DDP: rows per batch")
    parser.add_argument("--steps", type=int, default=STEPS, help="DDP: timed steps per run")
    parser.add_argument("--calls", type=int, default=OP_CALLS, help="per-op part: calls per round")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="per-op part: interleaved rounds")
    options = parser.parse_args()
    results: dict = {"machine": os.environ.get("BENCH_MACHINE", "2-core VM, shared with other builds")}
    results["load_average_before"] = round(os.getloadavg()[0], 1)
    results["per_op_stand_in"] = stand_in_costs(options.calls * 4, options.repeats)
    with tempfile.TemporaryDirectory() as scratch:
        results["per_op_mpi"] = _mpi_costs(Path(scratch), options.calls, options.repeats)
        if not options.skip_ddp:
            results["ddp"] = _ddp(Path(scratch), options.width, options.batch, options.steps)
    results["load_average_after"] = round(os.getloadavg()[0], 1)
    print(json.dumps(results, indent=1))
    if options.json:
        options.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
