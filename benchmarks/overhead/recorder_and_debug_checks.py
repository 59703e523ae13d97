"""What the flight recorder and debug-mode mismatch checks cost per call, against the same calls
without them, measured in one run.

* ``recorder``: the facade's all_reduce (planned hot path) in a world of one on the null backend
  (isolates commlayer's own cost), its plan's launcher as built (the facade's fused launcher,
  which enters each call in the recorder inline) against the plain launcher the same backend op
  gets without a recorder; the difference is the recorder's per-call cost. The torch backends'
  launchers record inline the same way.
* ``debug``: 2 ranks on gloo, all_reduce of 4 floats on a group built with debug mode off and on
  (``COMMLAYER_DEBUG=detail`` compares each call's fingerprint across ranks through the store).

    python benchmarks/overhead/recorder_and_debug_checks.py [--iters 20000] [--debug-iters 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.distributed as torch_dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from facade_dispatch import NullBackend, per_call_us

import commlayer
from commlayer import dist
from commlayer.core.types import ReduceOp
from commlayer.facade.calls import dispatch, plans
from commlayer.launch import LaunchConfig, SuperviseOptions, launch


def recorder_cost(backend: str, iters: int, repeats: int) -> tuple[float, float]:
    """(us per all_reduce with the recorder, us without it) on a world of one."""
    dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1)
    tensor = torch.ones(2)
    try:
        dist.all_reduce(tensor)  # builds the plan
        ((key, plan),) = [(key, plan) for key, plan in dispatch.plans.items() if key[0] == "all_reduce"]
        unrecorded = plans.op_run(plan.call.backend, "all_reduce", (ReduceOp.SUM,), False)
        recorded, bare = plan, plan._replace(run=unrecorded)

        def with_plan(chosen):
            def call() -> None:
                dispatch.plans[key] = chosen
                dist.all_reduce(tensor)

            return call

        best = per_call_us({"recorded": with_plan(recorded), "bare": with_plan(bare)}, iters, repeats)
    finally:
        dist.destroy_process_group()
    return best["recorded"], best["bare"]


def debug_rank(iters: int) -> None:
    """One rank of the debug-mode comparison (started twice by ``debug_cost``)."""
    dist.init_process_group("gloo")
    plain = dist.new_group(list(range(dist.get_world_size())))
    os.environ["COMMLAYER_DEBUG"] = "detail"  # read when a group is built
    checked = dist.new_group(list(range(dist.get_world_size())))
    tensor = torch.ones(4)
    timings = {}
    for _ in range(2):  # the second round is the one reported (warm store connections)
        for name, group in (("off", plain), ("detail", checked)):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(tensor, group=group)
            timings[name] = (time.perf_counter() - start) / iters * 1e6
    if dist.get_rank() == 0:
        print("DEBUG " + json.dumps(timings), flush=True)
    dist.destroy_process_group()


def debug_cost(iters: int) -> dict[str, float]:
    command = (sys.executable, __file__, "--debug-rank", "--debug-iters", str(iters))
    options = SuperviseOptions(timeout=300, echo=False, tail_lines=20)
    result = launch(LaunchConfig(command, 2, options=options))
    lines = [line for outcome in result.outcomes for line in outcome.output_tail if line.startswith("DEBUG ")]
    if result.exit_code != 0 or not lines:
        raise SystemExit(f"debug-mode ranks failed: {result.summary()}")
    return json.loads(lines[0][len("DEBUG ") :])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--debug-iters", type=int, default=300)
    parser.add_argument("--debug-rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.debug_rank:
        debug_rank(args.debug_iters)
        return
    commlayer.register_backend("null", NullBackend)
    print(f"# {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}")
    print(f"{'case':<34} {'with_us':>9} {'without_us':>11} {'added_us':>9}")
    for backend in ("null",):
        recorded, bare = recorder_cost(backend, args.iters, args.repeats)
        print(
            f"{'recorder, all_reduce on ' + backend:<34} {recorded:>9.2f} {bare:>11.2f} {recorded - bare:>9.2f}"
        )
    debug = debug_cost(args.debug_iters)
    print(
        f"{'debug=detail, 2-rank gloo all_reduce':<34} {debug['detail']:>9.1f} {debug['off']:>11.1f} "
        f"{debug['detail'] - debug['off']:>9.1f}"
    )


if __name__ == "__main__":
    main()
