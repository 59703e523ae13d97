"""What the profiler hook and the public hooks cost per call while neither is in use, against the
same calls without them, measured in one run (a world of one on the null backend: commlayer's own
cost only).

* ``planned``: all_reduce through its plan (the C lookup). The hook adds no code to this path:
  a plan built while no profiler runs is the plain fast path (checked here), and starting or
  stopping a profiler drops every plan. Reported against the same call with the plan's fast path
  replaced by the plain backend fast path: the difference is noise around zero.
* ``unplanned``: reduce, through ``dispatch.run_op``, which tests one module flag; against a copy
  of ``run_op`` compiled without that test, swapped in for the "without" rounds.
* ``flag test``: run_op's branch alone, with and without the flag's test, in dispatch's namespace
  (the whole-call comparison above is within a shared machine's noise; this is the added work).
* ``hook check``: what a call pays for hooks while none is registered. Planned calls pay nothing
  (a plan built with no hook is the plain plan, checked here); unplanned calls test whether an
  observer is set: reduce through ``run_op`` against a copy compiled without that test, and the
  branch alone with and without it.
* ``recording``: all_reduce while a torch.profiler runs (the price of an event, for reference).
* ``hooks``: all_reduce through the plan rebuilt after a pre-hook was registered and removed,
  against the plain plan (no hook code remains); and with one pre-hook registered, for reference.

Every comparison runs both sides in alternating order, ``--repeats`` rounds of ``--iters`` calls
each, and reports the medians of each side and of the per-round difference (``added``).

    python benchmarks/overhead/profiler_and_hooks.py [--iters 20000] [--repeats 31] [--json FILE]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as torch_dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from facade_dispatch import NullBackend, per_call_us

import commlayer
from commlayer import dist, hooks
from commlayer.core.types import ReduceOp
from commlayer.core.work import CompletedWork, Work
from commlayer.facade.calls import dispatch
from commlayer.facade.ops import rooted as rooted_collectives


class _ReducingNull(NullBackend):
    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, *, async_op: bool = True) -> Work:
        return CompletedWork()


_BRANCH = "if _observer is None and not _profiling:"
#: run_op's branch without one of its two tests: the profiler flag's, or the observer's (hooks).
_WITHOUT = {"profiler": "if _observer is None:", "hooks": "if not _profiling:"}


def _run_op_without(test: str) -> object:
    """``dispatch.run_op`` compiled without one test of its branch, in dispatch's namespace."""
    source = textwrap.dedent(inspect.getsource(dispatch.run_op))
    assert _BRANCH in source
    namespace: dict[str, object] = {}
    exec(compile(source.replace(_BRANCH, _WITHOUT[test]), "<run_op>", "exec"), vars(dispatch), namespace)  # noqa: S102 - our own source, minus one test
    return namespace["run_op"]


def _branches(test: str) -> tuple[object, object]:
    """run_op's branch alone, with and without one of its tests, in dispatch's namespace."""
    source = (
        f"def with_test():\n    {_BRANCH}\n        return 1\n    return 0\n"
        f"def without_test():\n    {_WITHOUT[test]}\n        return 1\n    return 0\n"
    )
    namespace: dict[str, object] = {}
    exec(compile(source, "<branch>", "exec"), vars(dispatch), namespace)  # noqa: S102 - a literal above
    return namespace["with_test"], namespace["without_test"]


def _timed(call: Callable[[], object], iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - start) / iters * 1e6


def _paired(calls: dict[str, Callable[[], object]], iters: int, repeats: int) -> dict[str, float]:
    """Median us per call of each side, and of their per-round difference ("added"), over
    ``repeats`` rounds whose sides alternate in going first (after one untimed warm-up round)."""
    per_call_us(calls, iters // 10 or 1, 1)
    names = list(calls)
    rounds: dict[str, list[float]] = {name: [] for name in names}
    for index in range(repeats):
        for name in names if index % 2 else names[::-1]:
            rounds[name].append(_timed(calls[name], iters))
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    if "without" in rounds:
        pairs = zip(rounds["with"], rounds["without"])
        medians["added"] = statistics.median(with_us - without_us for with_us, without_us in pairs)
    return medians


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

        planned = _paired({"with": with_plan(plan), "without": with_plan(bare)}, iters, repeats)
        checked = dispatch.run_op

        def with_run_op(chosen):
            def call() -> None:
                rooted_collectives.run_op = chosen
                dist.reduce(tensor, dst=0)

            return call

        unplanned = {
            test: _paired(
                {"with": with_run_op(checked), "without": with_run_op(_run_op_without(test))}, iters, repeats
            )
            for test in _WITHOUT
        }
        rooted_collectives.run_op = checked
        alone = {
            test: _paired(dict(zip(("with", "without"), _branches(test))), iters * 20, repeats)
            for test in _WITHOUT
        }
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True):
            recording = per_call_us({"with": lambda: dist.all_reduce(tensor)}, iters // 10, 3)["with"]
        hooked, unhooked = _hook_costs(tensor, key, bare, iters, repeats)
    finally:
        dist.destroy_process_group()
    return {
        "planned all_reduce, no profiler": planned,
        "unplanned reduce, no profiler": unplanned["profiler"],
        "flag test alone": alone["profiler"],
        "unplanned reduce, no hook": unplanned["hooks"],
        "hook check alone": alone["hooks"],
        "all_reduce while profiling": _against(recording, planned["with"]),
        "all_reduce, hook removed": _against(unhooked, planned["without"]),
        "all_reduce with one pre-hook": _against(hooked, planned["without"]),
    }


def _against(with_us: float, without_us: float) -> dict[str, float]:
    return {"with": with_us, "without": without_us, "added": with_us - without_us}


def _hook_costs(
    tensor: torch.Tensor, key: object, bare: object, iters: int, repeats: int
) -> tuple[float, float]:
    """Per call: all_reduce with one pre-hook registered, then after it was removed (the plan rebuilt)."""
    handle = hooks.register_pre_hook(lambda call: None)
    dist.all_reduce(tensor)
    hooked = _paired({"with": lambda: dist.all_reduce(tensor)}, iters, repeats)["with"]
    handle.remove()
    dist.all_reduce(tensor)  # rebuilds the plan without the hook
    rebuilt = dispatch.plans[key]
    assert type(rebuilt.run) is type(bare.run), (rebuilt.run, bare.run)
    return hooked, _paired({"with": lambda: dist.all_reduce(tensor)}, iters, repeats)["with"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument(
        "--json", type=Path, default=None, metavar="FILE", help="also write the cases as JSON"
    )
    args = parser.parse_args()
    commlayer.register_backend("null", _ReducingNull)
    print(f"# {platform.machine()}, {os.cpu_count()} cpus, torch {torch.__version__}")
    print(f"{'case':<34} {'with_us':>9} {'without_us':>11} {'added_us':>9}")
    cases = measure(args.iters, args.repeats)
    for case, row in cases.items():
        print(f"{case:<34} {row['with']:>9.3f} {row['without']:>11.3f} {row['added']:>9.3f}")
    if args.json is not None:
        _write_json(args.json, cases, " ".join(sys.argv[1:]))


def _write_json(path: Path, cases: dict[str, dict[str, float]], arguments: str) -> None:
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "command": f"python benchmarks/overhead/profiler_and_hooks.py {arguments}".strip(),
        "load_average": round(os.getloadavg()[0], 2),
        "statistic": "medians over alternating rounds; added_us is the median per-round difference",
    }
    rows = [
        {"case": case, **{f"{key}_us": round(value, 4) for key, value in row.items()}}
        for case, row in cases.items()
    ]
    path.write_text(json.dumps({"meta": meta, "cases": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
