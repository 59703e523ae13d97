"""Fault injection: kill a random member at a random step of a 2 replicas x 2 shards CPU job.

Each run starts a 4-member fault-tolerant ZeRO-2 job (``commlayer.ft``), kills one member
(SIGKILL, SIGTERM, or a hang) at a random step, and, in the first ``--second`` runs, SIGKILLs a
member of the broken replica again while it recovers. A spare started ahead of time replaces
each dead member. Reported per run: whether every member finished every step, the largest
deviation of the final parameters from a one-process replay that drops the same contributions,
the time lost per failure (the slowest never-killed member's training time minus the median of
fault-free runs measured in the same invocation, divided by the kills), and the fault.

    python benchmarks/faults/fault_injection.py --runs 50 --second 10 --backend gloo
    python benchmarks/faults/fault_injection.py --runs 5 --second 0 --backend nccl --device cuda   # 4 GPUs
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from commlayer.testing.fault_injection import FaultPlan, JobResult, random_plan, run_job


def survivor_seconds(result: JobResult, members: int) -> float:
    """Training time of the slowest member that was never killed (None when none finished)."""
    times = [result.members[f"m{m}"]["seconds"] for m in range(members) if f"m{m}" in result.members]
    return max(times) if times else float("nan")


def main() -> None:
    args = _parse()
    rng = random.Random(args.seed)
    common = {
        "backend": args.backend,
        "device": args.device,
        "steps": args.steps,
        "step_time": args.step_time,
        "deadline_s": args.deadline,
    }
    records: list[dict] = []
    with tempfile.TemporaryDirectory() as temporary:
        scratch = args.workdir or temporary  # the members' logs and reports stay in --workdir
        baseline = []
        for index in range(args.baseline_runs):
            result = run_job(Path(scratch) / f"ref{index}", FaultPlan(), **common)
            baseline.append(survivor_seconds(result, 4))
        reference = statistics.median(baseline)
        print(f"fault-free training time: median {reference:.2f}s of {baseline}", flush=True)
        for index in range(args.runs):
            plan = random_plan(rng, 4, args.steps, second=index < args.second)
            result = run_job(Path(scratch) / f"run{index}", plan, seed=index, **common)
            kills = 2 if plan.second else 1
            record = {
                "run": index,
                "fault": plan.fault,
                "member": plan.member,
                "step": plan.step,
                "second_kill": plan.second,
                "completed": result.completed,
                "hung": result.hung,
                "max_error": result.max_error,
                "steps_completed": min(
                    (m["step"] for m in result.members.values() if m["status"] == "finished"), default=0
                ),
                "lost_per_failure_s": (survivor_seconds(result, 4) - reference) / kills,
                "errors": result.errors,
            }
            records.append(record)
            print(json.dumps(record), flush=True)
            _write(args, reference, baseline, records)
    _summary(args, reference, records)


def _write(args: argparse.Namespace, reference: float, baseline: list[float], records: list[dict]) -> None:
    if not args.out:
        return
    meta = {
        "machine": _machine(args.device),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": f"python benchmarks/faults/fault_injection.py --runs {args.runs} --second {args.second} "
        f"--backend {args.backend} --device {args.device} --steps {args.steps} --step-time {args.step_time}",
        "fault_free_seconds": baseline,
        "reference_seconds": reference,
        "step_seconds": reference / args.steps,
    }
    Path(args.out).write_text(json.dumps({"meta": meta, "runs": records}, indent=1))


def _machine(device: str) -> str:
    host = f"{platform.node()} {platform.processor() or platform.machine()}"
    if device == "cpu":
        return host
    return f"{host}, {torch.cuda.device_count()}x {torch.cuda.get_device_name()}, torch {torch.__version__}"


def _summary(args: argparse.Namespace, reference: float, records: list[dict]) -> None:
    right = sum(1 for r in records if r["completed"] and r["max_error"] <= 1e-6)
    hung = sum(1 for r in records if r["hung"])
    lost = [r["lost_per_failure_s"] for r in records if r["completed"]]
    median = statistics.median(lost) if lost else float("nan")
    print(
        f"{right}/{len(records)} finished with the right parameters, {hung} hung; median time lost per "
        f"failure {median:.2f}s (one step {reference / args.steps:.3f}s)"
    )


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--second", type=int, default=10, help="runs with a second kill during recovery")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one GPU per member")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--step-time", type=float, default=0.2, help="seconds of simulated compute per step")
    parser.add_argument("--baseline-runs", type=int, default=2)
    parser.add_argument("--deadline", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    parser.add_argument("--workdir", default="", help="keep each run's member logs here")
    return parser.parse_args()


if __name__ == "__main__":
    main()
