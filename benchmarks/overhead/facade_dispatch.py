"""CPU dispatch overhead: a facade call against a direct call of the same backend, in us per call.

Two measurements, both in one process so nothing but dispatch differs:

* ``null``: a backend whose ops do nothing, so the facade's own cost (validate, resolve the group,
  stage, wrap the Work, wait) is all that is timed.
* ``gloo``: a world of one on gloo, facade vs raw ``torch.distributed`` on the same tensor.

    python benchmarks/overhead/facade_dispatch.py [--iters 5000] [--repeats 25]
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable

import torch
import torch.distributed as torch_dist

import commlayer
from commlayer import Availability, Backend, Capabilities, GroupSpec, ReduceOp, dist
from commlayer.core.work import CompletedWork, Work


class NullBackend(Backend):
    """Does no communication: isolates the facade's cost."""

    name = "null"
    capabilities = Capabilities(devices=frozenset({"cpu"}))

    @classmethod
    def is_available(cls) -> Availability:
        return Availability.yes()

    @classmethod
    def create_world(cls, spec: GroupSpec) -> NullBackend:
        return cls(spec)

    def new_group(self, spec: GroupSpec) -> NullBackend | None:
        return type(self)(spec) if spec.is_member else None

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool) -> Work:
        return CompletedWork()

    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool) -> Work:
        return CompletedWork()

    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool) -> Work:
        return CompletedWork()

    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool) -> Work:
        return CompletedWork()

    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool) -> Work:
        return CompletedWork()

    def barrier(self, *, async_op: bool) -> Work:
        return CompletedWork()


def per_call_us(calls: dict[str, Callable[[], object]], iters: int, repeats: int) -> dict[str, float]:
    """Best mean time per call of each callable, over ``repeats`` interleaved rounds.

    Interleaving and taking the minimum keeps a busy neighbour on a 2-core machine from
    landing on one side of the comparison only.
    """
    best = {name: float("inf") for name in calls}
    for call in calls.values():
        for _ in range(iters // 10):
            call()
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            for _ in range(iters):
                call()
            best[name] = min(best[name], (time.perf_counter() - start) / iters * 1e6)
    return best


def measure(backend: str, iters: int, repeats: int) -> tuple[float, float]:
    dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1)
    tensor = torch.ones(2)
    communicator = dist.group.WORLD.primary_backend
    if backend == "gloo":
        direct = lambda: torch_dist.all_reduce(tensor)
    else:
        direct = lambda: communicator.all_reduce(tensor, ReduceOp.SUM, async_op=False).wait()
    try:
        best = per_call_us({"facade": lambda: dist.all_reduce(tensor), "direct": direct}, iters, repeats)
    finally:
        dist.destroy_process_group()
    return best["facade"], best["direct"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iters", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    commlayer.register_backend("null", NullBackend)
    print(
        f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print(f"{'backend':<8} {'reference':<26} {'facade_us':>10} {'direct_us':>10} {'added_us':>9}")
    for backend, reference in (
        ("null", "backend.all_reduce().wait()"),
        ("gloo", "torch.distributed.all_reduce"),
    ):
        facade, direct = measure(backend, args.iters, args.repeats)
        print(f"{backend:<8} {reference:<26} {facade:>10.2f} {direct:>10.2f} {facade - direct:>9.2f}")


if __name__ == "__main__":
    main()
