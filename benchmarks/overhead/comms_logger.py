"""Cost of the comms logger per facade call: disabled (the goal: < 0.5 us) and enabled.

The logger's only footprint on the dispatch path is the observer test in
``commlayer.facade.calls.dispatch.run_op`` (the closure and the message size are built only when an
observer is set). On a real ``OpCall`` (a world of one on gloo), with a ``start`` that returns an
already completed Work so that no communication hides the difference, three things are timed:

* ``backend call + wait``: what run_op does for the op itself, with nothing around it;
* ``run_op, logger disabled``: the facade's ``run_op``: its whole cost over the line above
  (observer test, copy-back test, wait) bounds the disabled logger's cost from above;
* ``run_op, logger enabled``: with ``comms_logger.enable()``: what enabling costs per call.

Then a real gloo all_reduce of 1 float32, through the whole facade, disabled vs enabled.

    python benchmarks/overhead/comms_logger.py [--calls 200000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as torch_dist

from commlayer import comms_logger, dist
from commlayer.core.work import CompletedWork
from commlayer.facade.calls import dispatch


def ns_per_call(variants: dict[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, float]:
    """Median over ``rounds`` of each variant's mean ns per call; rounds interleave the variants so
    that a busy neighbour on this 2-core machine does not land on one variant only."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for function in variants.values():  # warm caches and the specialising interpreter
        for _ in range(calls // 10):
            function()
    for _ in range(rounds):
        for name, function in variants.items():
            began = time.perf_counter_ns()
            for _ in range(calls):
                function()
            samples[name].append((time.perf_counter_ns() - began) / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


def measure_run_op(calls: int, rounds: int) -> dict[str, float]:
    call = dispatch.begin("all_reduce", None, torch.device("cpu"))
    assert call is not None
    done, tensor = CompletedWork(), torch.ones(1)
    start = lambda backend, mode: done
    run_op = dispatch.run_op
    variants = {
        "backend call + wait": lambda: start(call.backend, None).wait(),
        "run_op, logger disabled": lambda: run_op(call, start, async_op=False, payload=tensor),
    }
    results = ns_per_call(variants, calls, rounds)
    comms_logger.enable()
    try:
        results |= ns_per_call(
            {"run_op, logger enabled": variants["run_op, logger disabled"]}, calls // 10, rounds
        )
    finally:
        comms_logger.disable()
        comms_logger.reset()
    return results


def measure_all_reduce(calls: int, rounds: int) -> dict[str, float]:
    tensor = torch.ones(1)
    all_reduce = lambda: dist.all_reduce(tensor)
    results = ns_per_call({"all_reduce, logger disabled": all_reduce}, calls, rounds)
    comms_logger.enable()
    try:
        results |= ns_per_call({"all_reduce, logger enabled": all_reduce}, calls, rounds)
    finally:
        comms_logger.disable()
        comms_logger.reset()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200_000, help="calls per round of the run_op variants")
    parser.add_argument("--rounds", type=int, default=15)
    options = parser.parse_args()
    dist.init_process_group(
        "gloo", store=torch_dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60)
    )
    try:
        unplanned = measure_run_op(options.calls, options.rounds)
        facade = measure_all_reduce(options.calls // 20, options.rounds)
    finally:
        dist.destroy_process_group()
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
        f"python {platform.python_version()}, torch {torch.__version__}"
    )
    print("| measurement | ns per call |\n|---|---:|")
    for name, value in (unplanned | facade).items():
        print(f"| {name} | {value:.0f} |")
    reference = unplanned["backend call + wait"]
    print(
        f"\ndisabled logger overhead <= {unplanned['run_op, logger disabled'] - reference:+.0f} ns per call "
        "(all of run_op's own work; goal < 500 ns)"
    )
    print(f"enabled logger, run_op only: {unplanned['run_op, logger enabled'] - reference:+.0f} ns per call")
    print(
        f"enabled logger, gloo all_reduce of 1 float: "
        f"{facade['all_reduce, logger enabled'] - facade['all_reduce, logger disabled']:+.0f} ns per call"
    )


if __name__ == "__main__":
    main()
