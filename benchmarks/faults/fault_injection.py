"""Fault injection through the launcher: break a 2 replicas x 2 shards job under `commlayer run --ft`.

Each run starts `commlayer run --ft -n 4` on a ZeRO-2 job of `commlayer.testing.ft_member`
members and, from outside as a user would, breaks a random member at a random step: SIGKILL,
SIGTERM, or a hang (its loop stops while its heartbeat goes on); the first `--second` runs also
SIGKILL the replacement or its partner while the replica recovers. The launcher restarts each dead
member in its slot. Reported per run: whether every member finished every step (launcher exit 0),
the largest deviation of the final parameters from a one-process replay that drops the same
contributions, whether it hung, and the time lost per failure: the slowest never-killed member's
training time (from its first step) minus the median of the fault-free runs measured in the same
invocation, divided by the kills; and the same cost read from the survivors' own steps
(:func:`recovery_seconds`), which the machine's load does not blur. `--outcomes` adds one run of each other failure kind and checks
its defined outcome: a member whose restarts all fail (`restart-fails`: the launcher ends the job
with a non-zero status within 5 s of the last failure) and the store host's death (`store-host`:
the launcher killed; every member gone within 3 s).

    python benchmarks/faults/fault_injection.py --runs 30 --second 6 --outcomes --out data.json
    python benchmarks/faults/fault_injection.py --runs 3 --second 0 --backend nccl --device cuda   # GPUs
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

MEMBERS = 4


def survivor_seconds(result: JobResult, victims: set[int]) -> float:
    """Training time of the slowest member that was never broken (NaN when none finished)."""
    times = [
        report["seconds"]
        for label, report in result.members.items()
        if label.endswith("r0") and int(label[1:-2]) not in victims and report["status"] == "finished"
    ]
    return max(times) if times else float("nan")


def recovery_seconds(report: dict) -> float | None:
    """What the failures cost one member in its own steps: the extra duration, over the median
    step of the same run, of each step at which it entered a new generation (the step retried
    after a death, the step at which a replacement joined). Machine load shifts every step alike,
    so this holds where a comparison with separate fault-free runs drowns in the load's noise."""
    ends = dict(report["timings"].get("step_ends", []))
    durations = {step: ends[step] - ends[step - 1] for step in ends if step - 1 in ends}
    if not durations:
        return None
    typical = statistics.median(durations.values())
    rebuilt = [entry["step"] + 1 for entry in report["timings"]["generations"][1:]]
    return sum(durations[step] - typical for step in rebuilt if step in durations)


def main() -> None:
    args = _parse()
    rng = random.Random(args.seed)
    common = {
        "backend": args.backend,
        "device": args.device,
        "steps": args.steps,
        "step_time": args.step_time,
        "deadline_s": args.deadline,
        "hang_timeout": args.hang_timeout,
    }
    with tempfile.TemporaryDirectory() as temporary:
        scratch = Path(args.workdir or temporary)  # the members' logs and reports stay in --workdir
        baseline = [
            survivor_seconds(run_job(scratch / f"ref{index}", FaultPlan(), seed=index, **common), set())
            for index in range(args.baseline_runs)
        ]
        reference = statistics.median(baseline)
        print(f"fault-free training time: median {reference:.2f}s of {baseline}", flush=True)
        records: list[dict] = []
        for index in range(args.runs):
            plan = random_plan(rng, MEMBERS, args.steps, index < args.second, tuple(args.faults.split(",")))
            records.append(_run(scratch / f"run{index}", index, plan, reference, common))
            print(json.dumps(records[-1]), flush=True)
            _write(args, reference, baseline, records)
        if args.outcomes:
            for fault in ("restart-fails", "store-host"):
                plan = FaultPlan(rng.randrange(MEMBERS), rng.randrange(2, args.steps // 3), fault)
                records.append(_run(scratch / fault, len(records), plan, reference, common))
                print(json.dumps(records[-1]), flush=True)
                _write(args, reference, baseline, records)
    _summary(args, reference, records)


def _run(workdir: Path, index: int, plan: FaultPlan, reference: float, common: dict) -> dict:
    result = run_job(workdir, plan, seed=index, **common)
    restarts = {int(member): count for member, count in result.job.get("restarts", {}).items()}
    victims = set(restarts) | ({plan.member} if plan.member is not None else set())
    kills = 2 if plan.second else 1
    broken = {victim // 2 for victim in victims}  # replicas of 2 shards that lost a member
    costs = [
        recovery_seconds(report)
        for label, report in result.members.items()
        if label.endswith("r0") and int(label[1:-2]) // 2 not in broken and report["status"] == "finished"
    ]
    costs = [cost for cost in costs if cost is not None]
    record = {
        "run": index,
        "fault": plan.fault,
        "member": plan.member,
        "step": plan.step,
        "second_kill": plan.second,
        "exit_code": result.exit_code,
        "completed": result.completed,
        "hung": result.hung,
        "max_error": result.max_error,
        "restarts": restarts,
        "rejoined": result.job.get("rejoined", {}),
        "replacements": {
            label: report["timings"] for label, report in result.members.items() if not label.endswith("r0")
        },
        "survivors": {
            label: report["timings"]["generations"]
            for label, report in result.members.items()
            if label.endswith("r0") and int(label[1:-2]) not in victims
        },
        "lost_per_failure_s": (survivor_seconds(result, victims) - reference) / kills,
        "recovery_per_failure_s": max(costs) / kills if costs else None,
        "ended_after_fault_s": result.ended_s,
        "errors": result.errors,
    }
    record["as_defined"] = _as_defined(plan.fault, result)
    return record


def _as_defined(fault: str, result: JobResult) -> bool:
    """Whether the job ended as the fault-tolerance guide's table says it does."""
    if fault == "restart-fails":
        return result.exit_code not in (0, None) and not result.hung and (result.ended_s or 99) < 5.0
    if fault == "store-host":
        return result.members_gone_s is not None and result.members_gone_s < 3.0
    return result.completed and result.max_error <= 1e-6


def _write(args: argparse.Namespace, reference: float, baseline: list[float], records: list[dict]) -> None:
    if not args.out:
        return
    command = (
        f"python benchmarks/faults/fault_injection.py --runs {args.runs} --second {args.second} "
        f"--backend {args.backend} --device {args.device} --steps {args.steps} --step-time {args.step_time} "
        f"--faults {args.faults}" + (" --outcomes" if args.outcomes else "")
    )
    meta = {
        "machine": _machine(args.device),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": command,
        "fault_free_seconds": baseline,
        "reference_seconds": reference,
        "step_seconds": reference / (args.steps - 1),
    }
    Path(args.out).write_text(json.dumps({"meta": meta, "runs": records}, indent=1))


def _machine(device: str) -> str:
    host = f"{platform.node()} {platform.processor() or platform.machine()}"
    if device == "cpu":
        return host
    return f"{host}, {torch.cuda.device_count()}x {torch.cuda.get_device_name()}, torch {torch.__version__}"


def _summary(args: argparse.Namespace, reference: float, records: list[dict]) -> None:
    random_runs = [r for r in records if r["fault"] in ("sigkill", "sigterm", "hang")]
    right = sum(1 for r in random_runs if r["as_defined"])
    hung = sum(1 for r in records if r["hung"])
    lost = [r["lost_per_failure_s"] for r in random_runs if r["completed"]]
    median = statistics.median(lost) if lost else float("nan")
    recovery = [r["recovery_per_failure_s"] for r in random_runs if r["recovery_per_failure_s"] is not None]
    print(
        f"{right}/{len(random_runs)} finished with the right parameters, {hung} hung; median time lost per "
        f"failure {median:.2f}s against fault-free runs, {statistics.median(recovery or [float('nan')]):.2f}s "
        f"in the survivors' own steps (one step {reference / (args.steps - 1):.3f}s)"
    )
    rejoins = [rejoin for r in random_runs for rejoin in r["rejoined"].values()]
    started = [t for r in random_runs for t in r["replacements"].values()]
    phases = {
        "CUDA context": [t["cuda_context_s"] for t in started if t["cuda_context_s"] is not None],
        "start-up (interpreter, imports, CUDA context, model)": [t["startup_s"] for t in started],
        "quorum": [rejoin["quorum_s"] for rejoin in rejoins],
        "communicators (NCCL init on GPUs)": [rejoin["communicators_s"] for rejoin in rejoins],
        "state transfer": [rejoin["state_s"] for rejoin in rejoins],
        "from its start to its first step": [rejoin["since_start_s"] for rejoin in rejoins],
    }
    for name, values in phases.items():
        if values:
            print(f"replacement rejoin, {name}: median {statistics.median(values):.3f}s of {len(values)}")
    for record in records:
        if record["fault"] not in ("sigkill", "sigterm", "hang"):
            verdict = "as defined" if record["as_defined"] else "NOT as defined"
            print(
                f"{record['fault']}: {verdict} (exit {record['exit_code']}, ended {record['ended_after_fault_s']})"
            )


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--second", type=int, default=6, help="runs with a second kill during recovery")
    parser.add_argument("--faults", default="sigkill,sigterm,hang", help="what the random runs draw from")
    parser.add_argument("--outcomes", action="store_true", help="also the restart-fails and store-host runs")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: a GPU per member")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--step-time", type=float, default=0.2, help="seconds of simulated compute per step")
    parser.add_argument("--hang-timeout", type=float, default=1.5)
    parser.add_argument("--baseline-runs", type=int, default=3)
    parser.add_argument("--deadline", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="")
    parser.add_argument("--workdir", default="", help="keep each run's launcher and member logs here")
    return parser.parse_args()


if __name__ == "__main__":
    main()
