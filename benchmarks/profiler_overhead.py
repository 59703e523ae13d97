"""What the profiler hook and the public hooks cost per call while neither is in use, against the
same calls without them, measured in one run (a world of one on the null backend: commlayer's own
cost only).

* ``planned``: all_reduce through its plan (the C lookup). The hook adds no code to this path:
  a plan built while no profiler runs is the plain launcher (checked here), and starting or
  stopping a profiler drops every plan. Reported against the same call with the plan's launcher
  replaced by the plain backend launcher: the difference is noise around zero.
* ``unplanned``: reduce, through ``dispatch.launch``, which tests one module flag; against a copy
  of ``launch`` compiled without that test, swapped in for the "without" rounds.
* ``flag test``: launch's branch alone, with and without the flag's test, in dispatch's namespace
  (the whole-call comparison above is within a shared machine's noise; this is the added work).
* ``recording``: all_reduce while a torch.profiler runs (the price of an event, for reference).
* ``hooks``: all_reduce through the plan rebuilt after a pre-hook was registered and removed,
  against the plain plan (no hook code remains); and with one pre-hook registered, for reference.

    python benchmarks/profiler_overhead.py [--iters 20000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import sys
import textwrap
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dispatch_overhead import NullBackend, per_call_us

import commlayer
from commlayer import dist, hooks
from commlayer.facade import dispatch, rooted_collectives
from commlayer.types import ReduceOp
from commlayer.work import CompletedWork, Work


class _ReducingNull(NullBackend):
    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, *, async_op: bool = True) -> Work:
        return CompletedWork()


def _launch_without_check() -> object:
    """``dispatch.launch`` compiled without the profiler flag's test, in dispatch's namespace."""
    source = textwrap.dedent(inspect.getsource(dispatch.launch))
    assert " and not _profiling" in source
    namespace: dict[str, object] = {}
    exec(compile(source.replace(" and not _profiling", ""), "<launch>", "exec"), vars(dispatch), namespace)  # noqa: S102 - our own source, minus one test
    return namespace["launch"]


def _branches() -> tuple[object, object]:
    """launch's observer branch with and without the profiler flag's test, in dispatch's namespace."""
    source = (
        "def with_test():\n    if _observer is None and not _profiling:\n        return 1\n    return 0\n"
        "def without_test():\n    if _observer is None:\n        return 1\n    return 0\n"
    )
    namespace: dict[str, object] = {}
    exec(compile(source, "<branch>", "exec"), vars(dispatch), namespace)  # noqa: S102 - a literal above
    return namespace["with_test"], namespace["without_test"]


def _rotated(calls: dict[str, object], iters: int, repeats: int) -> dict[str, float]:
    """per_call_us over ``repeats`` rounds, each side going first in every other round."""
    names = list(calls)
    best = {name: float("inf") for name in names}
    for index in range(repeats):
        order = names if index % 2 else names[::-1]
        for name, value in per_call_us({name: calls[name] for name in order}, iters, 1).items():
            best[name] = min(best[name], value)
    return best


def measure(iters: int, repeats: int) -> dict[str, tuple[float, float]]:
    dist.init_process_group("null", store=torch_dist.HashStore(), rank=0, world_size=1)
    tensor = torch.ones(2)
    try:
        dist.all_reduce(tensor)  # builds the plan
        ((key, plan),) = [(k, p) for k, p in dispatch.plans.items() if k[0] == "all_reduce"]
        assert plan.run.__name__ != "profiled_run", plan.run
        # The same plan built again while no profiler runs: the hook's planned cost is none at all.
        bare = dispatch.new_plan(plan.call, "all_reduce", ReduceOp.SUM, dtype=tensor.dtype)

        def with_plan(chosen):
            def call() -> None:
                dispatch.plans[key] = chosen
                dist.all_reduce(tensor)

            return call

        planned = _rotated({"with": with_plan(plan), "without": with_plan(bare)}, iters, repeats)
        checked, unchecked = dispatch.launch, _launch_without_check()

        def with_launch(chosen):
            def call() -> None:
                rooted_collectives.launch = chosen
                dist.reduce(tensor, dst=0)

            return call

        unplanned = _rotated(
            {"with": with_launch(checked), "without": with_launch(unchecked)}, iters, repeats
        )
        rooted_collectives.launch = checked
        with_test, without_test = _branches()
        flag = _rotated({"with": with_test, "without": without_test}, iters * 20, repeats)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            recording = per_call_us({"with": lambda: dist.all_reduce(tensor)}, iters // 10, 3)["with"]
        hooked, unhooked = _hook_costs(tensor, key, bare, iters, repeats)
    finally:
        dist.destroy_process_group()
    return {
        "planned all_reduce, no profiler": (planned["with"], planned["without"]),
        "unplanned reduce, no profiler": (unplanned["with"], unplanned["without"]),
        "flag test alone": (flag["with"], flag["without"]),
        "all_reduce while profiling": (recording, planned["with"]),
        "all_reduce, hook removed": (unhooked, planned["without"]),
        "all_reduce with one pre-hook": (hooked, planned["without"]),
    }


def _hook_costs(
    tensor: torch.Tensor, key: object, bare: object, iters: int, repeats: int
) -> tuple[float, float]:
    """Per call: all_reduce with one pre-hook registered, then after it was removed (the plan rebuilt)."""
    handle = hooks.register_pre_hook(lambda call: None)
    dist.all_reduce(tensor)
    hooked = _rotated({"with": lambda: dist.all_reduce(tensor)}, iters, repeats)["with"]
    handle.remove()
    dist.all_reduce(tensor)  # rebuilds the plan without the hook
    rebuilt = dispatch.plans[key]
    assert type(rebuilt.run) is type(bare.run), (rebuilt.run, bare.run)
    return hooked, _rotated({"with": lambda: dist.all_reduce(tensor)}, iters, repeats)["with"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    commlayer.register_backend("null", _ReducingNull)
    print(f"# {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}")
    print(f"{'case':<34} {'with_us':>9} {'without_us':>11} {'added_us':>9}")
    for case, (with_us, without_us) in measure(args.iters, args.repeats).items():
        print(f"{case:<34} {with_us:>9.3f} {without_us:>11.3f} {with_us - without_us:>9.3f}")


if __name__ == "__main__":
    main()
