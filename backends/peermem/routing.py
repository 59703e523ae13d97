"""Which algorithm serves a call: the measured crossover table and the pure choice over it.

The table maps a group size to, per op, ascending ``(max_bytes, algorithm)`` rows: the first row
whose bound holds the call's bytes (the whole tensor: an all-reduce's tensor, an all-gather's
output, a reduce-scatter's input) names the algorithm; past the last row, NCCL. The rows come
from ``benchmarks/peermem_bench.py`` on the machine named in :data:`MEASURED_ON`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from commlayer.core import settings

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_ENV",
    "CROSSOVERS",
    "KERNEL_DTYPES",
    "MEASURED_ON",
    "choose",
    "fits",
    "grid_blocks",
]

#: Forces one algorithm for every call the kernels can serve (benchmarks): one of ALGORITHMS.
ALGORITHM_ENV = settings.PEERMEM_ALGORITHM.name
#: one_shot: every rank reads every peer's staged copy; two_shot: reduce-scatter then all-gather,
#: pulling; push: the same two steps (or a reduce-scatter's one), writing into the owners' regions.
ALGORITHMS = ("one_shot", "two_shot", "push", "nccl")
KERNEL_DTYPES: Mapping[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
MEASURED_ON = "4x NVIDIA H100 80GB HBM3 (NVLink), torch 2.11+cu130"

KiB, MiB = 1 << 10, 1 << 20
Rows = tuple[tuple[int, str], ...]

CROSSOVERS: Mapping[int, Mapping[str, Rows]] = {
    2: {
        "all_reduce": ((4 * MiB, "one_shot"), (16 * MiB, "push")),
        "all_gather_into_tensor": ((4 * MiB, "one_shot"),),
        "reduce_scatter_tensor": ((4 * MiB, "one_shot"), (16 * MiB, "push")),
    },
    4: {
        "all_reduce": ((1 * MiB, "one_shot"), (4 * MiB, "two_shot")),
        "all_gather_into_tensor": ((16 * MiB, "one_shot"),),
        "reduce_scatter_tensor": ((4 * MiB, "one_shot"),),
    },
}

THREADS = 512
MAX_BLOCKS = 64
PUSH_MAX_BLOCKS = 128


def fits(op: str, algorithm: str, nbytes: int, world: int, half_bytes: int) -> bool:
    """Whether a call of ``nbytes`` stages within one half of the region (``half_bytes``)."""
    if nbytes % (16 * world if op != "all_reduce" else 16):
        return False
    # Two-shot stages every rank's contributions and the gathered result: twice the tensor.
    staged = nbytes * (2 if op == "all_reduce" and algorithm == "push" else 1)
    if op == "all_gather_into_tensor":
        staged = nbytes // world
    return algorithm != "nccl" and staged <= half_bytes


def choose(
    table: Mapping[int, Mapping[str, Rows]],
    op: str,
    nbytes: int,
    world: int,
    half_bytes: int,
    forced: str | None = None,
) -> str:
    """The algorithm for one call: one of :data:`ALGORITHMS`.

    Args:
        table: crossovers by group size (:data:`CROSSOVERS`); a size missing from it uses the
            largest smaller one, and a group smaller than all of them gets NCCL.
        op: ``all_reduce``, ``all_gather_into_tensor`` or ``reduce_scatter_tensor``.
        nbytes: the whole tensor's bytes (see the module docstring).
        world: the group's size.
        half_bytes: the staging capacity per call.
        forced: an algorithm to use wherever the kernels can serve the call.
    """
    if forced is not None:
        if (forced == "two_shot" and op != "all_reduce") or (
            forced == "push" and op == "all_gather_into_tensor"
        ):
            forced = "one_shot"
        return forced if fits(op, forced, nbytes, world, half_bytes) else "nccl"
    sizes = [size for size in table if size <= world]
    if not sizes or world < 2:
        return "nccl"
    for bound, algorithm in table[max(sizes)].get(op, ()):
        if nbytes <= bound:
            return algorithm if fits(op, algorithm, nbytes, world, half_bytes) else "nccl"
    return "nccl"


def grid_blocks(op: str, algorithm: str, nbytes: int, world: int, max_blocks: int = MAX_BLOCKS) -> int:
    """Blocks of the kernel's grid: a function of the call alone, so equal on every rank."""
    if algorithm == "push":
        max_blocks = PUSH_MAX_BLOCKS
    if op == "all_reduce" and algorithm in ("two_shot", "push"):
        units = -(-nbytes // world) // 16
    elif op == "all_reduce":
        units = nbytes // 16
    else:
        units = nbytes // world // 16
    return max(1, min(max_blocks, -(-units // THREADS)))
