"""Where an 8-byte shm all_reduce's time goes outside the synchronisation: the facade's call, the
plan's fused launcher and the native op, each timed alone in one world-of-one process.

* ``dist``: ``dist.all_reduce`` / ``dist.broadcast`` (the planned path: plan lookup, launcher, op);
* ``launcher``: the plan's launcher alone (flight-recorder entry, tensor address/count, op);
* ``native``: the communicator's pybind11 method on a raw address (no recorder, no tensor reads).

``dist - launcher`` is the lookup's cost, ``launcher - native`` the launcher's (plus the pybind11
call's ~0.1 us, which ``native`` pays and the launcher does not). A world of one has no peer, so
the native op is a copy and a one-input reduce: 2 ranks add the cross-core synchronisation
(``commlayer bench`` runs at 2 ranks measure that). Best of ``--repeats`` batches.

    python benchmarks/overhead/shm_call_cost.py [--iters 50000] [--repeats 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from commlayer import dist
from commlayer.core.ports import free_port
from commlayer.core.types import ReduceOp
from commlayer.facade.calls import dispatch


def best_ns(call: Callable[[], object], iters: int, repeats: int) -> float:
    """Best mean over ``repeats`` batches of ``iters`` calls, in ns: load only ever adds time."""
    return min(timeit.repeat(call, number=iters, repeat=repeats)) / iters * 1e9


def measure(elements: int, iters: int, repeats: int) -> dict[str, float]:
    """One row: every variant's time per call for a float32 tensor of ``elements``."""
    tensor = torch.ones(elements)
    dist.all_reduce(tensor)
    dist.broadcast(tensor, 0)
    key = ("all_reduce", None, ReduceOp.SUM, tensor.dtype, tensor.device, tensor.layout)
    plan = dispatch.plans[key]
    run, comm, address = plan.run, plan.call.backend._comm, tensor.data_ptr()
    calls: dict[str, Callable[[], object]] = {
        "dist.all_reduce": lambda: dist.all_reduce(tensor),
        "dist.broadcast": lambda: dist.broadcast(tensor, 0),
        "launcher": lambda: run(False, tensor),
        "native": lambda: comm.all_reduce(address, elements, 0, 0),
    }
    return {name: round(best_ns(call, iters, repeats)) for name, call in calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=50000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("shm")
    rows = {f"{elements * 4} B": measure(elements, args.iters, args.repeats) for elements in (2, 64)}
    dist.destroy_process_group()
    for size, row in rows.items():
        print(f"{size:>6}: " + ", ".join(f"{name} {ns} ns" for name, ns in row.items()))
    if args.json is not None:
        args.json.write_text(json.dumps({"load": os.getloadavg(), "ns_per_call": rows}, indent=1))


if __name__ == "__main__":
    main()
