"""torch_bridge_bench.py's per-op part: what the torch bridge adds to one all_reduce, and where.

Two measurements, each a set of paths timed in interleaved rounds, fastest round per path:

* ``stand-in``: a world of one on a null backend (ops complete at once, nothing communicated), in
  this process: only Python is timed. The backend called directly, the facade, the bridge as DDP
  and functional collectives call it, with its future, and torch's Python API on the bridge; then
  the bridge's own steps one by one (reading torch's reduce op, taking the tensor out of torch's
  one-element list, building torch's Work, a completed future).
* ``mpi``: the same paths on a 1-rank mpi world (under mpirun), ops asynchronous as the bridge's
  are: the mpi backend hands each one to its ordered worker thread.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as torch_dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from facade_dispatch import NullBackend, per_call_us

import commlayer
from commlayer import dist
from commlayer.core.types import ReduceOp
from commlayer.core.work import CompletedWork

__all__ = ["mpi_rank", "stand_in_costs"]


def _paths(tensor: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The end-to-end paths of one 4-byte all_reduce on the current world, each waited for."""
    group = dist.group.WORLD
    backend, pg, options = group.primary_backend, group.torch_group, torch_dist.AllreduceOptions()
    return {
        "backend": lambda: backend.all_reduce(tensor, ReduceOp.SUM, async_op=True).wait(),
        "facade": lambda: dist.all_reduce(tensor, async_op=True).wait(),
        "bridge": lambda: pg.allreduce([tensor], options).wait(),
        "bridge_future": lambda: pg.allreduce([tensor], options).get_future().wait(),
        "torch_api_on_bridge": lambda: torch_dist.all_reduce(tensor, group=pg),
    }


def _steps(tensor: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The bridge's own steps, timed alone (their sum against bridge - facade shows the frames)."""
    pg, options, done = dist.group.WORLD.torch_group, torch_dist.AllreduceOptions(), CompletedWork()
    total = torch_dist.ReduceOp.SUM
    return {
        "read_reduce_op": lambda: options.reduceOp == total,
        "unpack_tensor_list": lambda: pg._single("all_reduce", "tensors", [tensor]),
        "build_torch_work": lambda: pg._bridged(done, [tensor]),
        "completed_future": lambda: pg._completer.future_of(done, [tensor]),
    }


def _summary(times: dict[str, float]) -> dict[str, float]:
    summary = {
        "bridge_added_vs_backend": times["bridge"] - times["backend"],
        "bridge_added_vs_facade": times["bridge"] - times["facade"],
        "facade_added_vs_backend": times["facade"] - times["backend"],
    }
    if "read_reduce_op" in times:
        steps = ("read_reduce_op", "unpack_tensor_list", "build_torch_work")
        summary["bridge_calls_and_frames"] = summary["bridge_added_vs_facade"] - sum(times[s] for s in steps)
    return {name: round(value, 3) for name, value in summary.items()}


def stand_in_costs(iters: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per-op times (us) of every path and step on the null backend, in this process."""
    commlayer.register_backend("null", NullBackend)
    dist.init_process_group("null", store=torch_dist.HashStore(), rank=0, world_size=1)
    try:
        tensor = torch.ones(1)
        times = per_call_us({**_paths(tensor), **_steps(tensor)}, iters, repeats)
    finally:
        dist.destroy_process_group()
    return {"us_per_op": {k: round(v, 3) for k, v in times.items()}, "summary": _summary(times)}


def mpi_rank(out_path: str, iters: str, repeats: str) -> None:
    """One rank of an mpi world of one: the paths' per-op times, written to ``out_path``."""
    times = per_call_us(_paths(torch.ones(1)), int(iters), int(repeats))
    result = {"us_per_op": {k: round(v, 3) for k, v in times.items()}, "summary": _summary(times)}
    Path(out_path).write_text(json.dumps(result))
