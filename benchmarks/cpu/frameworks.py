"""DeepSpeed ZeRO-2 and ZeRO-3 on the CPU: commlayer (shm, mpi) against DeepSpeed on torch's gloo.

    python benchmarks/cpu/frameworks.py --out benchmarks/data/frameworks

starts two 2-rank jobs: ``commlayer run -n 2`` (commlayer picks shm) and mpirun with
``COMMLAYER_BACKEND=mpi``. In each, every rank trains a 37.8M-parameter MLP (9 layers of
2048x2048, fp32, AdamW, micro-batch 8) with ``deepspeed.init_distributed(dist_backend=...)`` first on
gloo, then on commlayer, each ZeRO stage for WARMUP + STEPS steps, and rank 0 prints one JSON line
per run: seconds per step (mean of the timed steps) and the final loss. The driver writes every
line to OUT/<launcher>.jsonl and prints the table of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

WIDTH, LAYERS, BATCH = 2048, 9, 8


def _rank(warmup: int, steps: int) -> None:
    import deepspeed
    import deepspeed.comm as ds_dist

    os.environ.setdefault("LOCAL_RANK", os.environ.get("RANK", "0"))
    for backend in ("gloo", "commlayer"):
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
        for stage in (2, 3):
            seconds, loss = _train(stage, warmup, steps, ds_dist.get_rank())
            if ds_dist.get_rank() == 0:
                row = {"backend": backend, "group": torch.distributed.get_backend(), "stage": stage}
                print(json.dumps({**row, "s_per_step": round(seconds, 4), "loss": loss}), flush=True)
        ds_dist.destroy_process_group()


def _train(stage: int, warmup: int, steps: int, rank: int) -> tuple[float, float]:
    import deepspeed

    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()) for _ in range(LAYERS)]
    model = torch.nn.Sequential(*layers)
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    inputs = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(rank))
    for step in range(warmup + steps):
        if step == warmup:
            started = time.perf_counter()
        loss = engine(inputs).square().mean()
        engine.backward(loss)
        engine.step()
    seconds = (time.perf_counter() - started) / steps
    engine.destroy()
    return seconds, loss.item()


def _jobs(script: str, warmup: int, steps: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    from commlayer.testing import mpirun_plan

    rank_args = [script, "--rank", "--warmup", str(warmup), "--steps", str(steps)]
    bin_dir = Path(sys.executable).parent
    mpi_env = {**os.environ, "COMMLAYER_BACKEND": "mpi", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731"}
    plan = mpirun_plan(2, mpi_env)
    return {
        "shm": ([str(bin_dir / "commlayer"), "run", "-n", "2", *rank_args], dict(os.environ)),
        "mpi": ([*plan.argv, sys.executable, *rank_args], dict(plan.env)),
    }


def _table(results: dict[str, list[dict[str, object]]]) -> str:
    lines = [
        "| launcher | stage | gloo s/step | commlayer s/step | speed-up | same loss |",
        "|---|---|---|---|---|---|",
    ]
    for launcher, rows in results.items():
        for stage in (2, 3):
            gloo, ours = (
                next(r for r in rows if r["backend"] == b and r["stage"] == stage)
                for b in ("gloo", "commlayer")
            )
            speedup = float(gloo["s_per_step"]) / float(ours["s_per_step"])
            same = "yes" if gloo["loss"] == ours["loss"] else f"no ({gloo['loss']} / {ours['loss']})"
            lines.append(
                f"| {launcher} ({ours['group']}) | ZeRO-{stage} | {gloo['s_per_step']} | {ours['s_per_step']} | {speedup:.2f}x | {same} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.rank:
        _rank(args.warmup, args.steps)
        return
    results = {}
    for launcher, (argv, env) in _jobs(str(Path(__file__).resolve()), args.warmup, args.steps).items():
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200, check=False)
        decoder = json.JSONDecoder()  # mpirun's tags may run into a line: read the object alone
        found = [
            line[line.index('{"backend"') :] for line in done.stdout.splitlines() if '{"backend"' in line
        ]
        rows = [decoder.raw_decode(text)[0] for text in found]
        if done.returncode != 0 or len(rows) != 4:
            raise SystemExit(
                f"{launcher} job failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        results[launcher] = rows
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{launcher}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(_table(results))


if __name__ == "__main__":
    main()
