"""Which algorithm serves a call: the measured crossover table and the pure choice over it.

The table maps a group size to, per op, ascending ``(max_bytes, algorithm)`` rows: the first row
whose bound holds the call's bytes (the whole tensor: an all-reduce's tensor, an all-gather's
output, a reduce-scatter's input, an all-to-all's input) names the algorithm; past the last row,
NCCL. The rows come from ``benchmarks/gpu/peermem.py`` on the machine named in
:data:`MEASURED_ON`. Every input of the choice is equal on every rank of a call (sizes, dtypes,
the group), so every rank picks the same algorithm: one rank on a kernel while another is on NCCL
would wait for ever.
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
    "choose_uneven",
    "fits",
    "grid_blocks",
]

#: Forces one algorithm for every call the kernels can serve (benchmarks): one of ALGORITHMS.
ALGORITHM_ENV = settings.PEERMEM_ALGORITHM.name
#: one_shot: every rank reads every peer's staged copy; one_shot_push: every rank writes its input
#: into every peer's region and reduces locally; two_shot: reduce-scatter then all-gather, pulling
#: staged copies; push: the same two steps (or a reduce-scatter's one), writing into the owners'
#: regions; zero_copy: peers read and write the callers' tensors where they lie (registered
#: segments), staging only what is not registered yet, in rounds, so any size fits.
ALGORITHMS = ("one_shot", "one_shot_push", "two_shot", "push", "zero_copy", "nccl")
KERNEL_DTYPES: Mapping[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
MEASURED_ON = "4 and 2 of 4 NVIDIA H200 (NVLink, NV18), torch 2.11+cu130"

KiB, MiB = 1 << 10, 1 << 20
Rows = tuple[tuple[int, str], ...]
#: all_to_all_single has one row: every rank must take the same path whatever its own sizes.
_ALL_TO_ALL: Rows = ((1 << 62, "zero_copy"),)

CROSSOVERS: Mapping[int, Mapping[str, Rows]] = {
    2: {
        "all_reduce": ((4 * MiB, "one_shot"), (16 * MiB, "push"), (256 * MiB, "zero_copy")),
        "all_gather_into_tensor": ((16 * MiB, "one_shot"), (256 * MiB, "zero_copy")),
        "reduce_scatter_tensor": ((4 * MiB, "one_shot"), (256 * MiB, "zero_copy")),
        "all_to_all_single": _ALL_TO_ALL,
    },
    4: {
        "all_reduce": ((256 * KiB, "one_shot"), (16 * MiB, "zero_copy")),
        "all_gather_into_tensor": ((4 * MiB, "one_shot"), (256 * MiB, "zero_copy")),
        "reduce_scatter_tensor": ((16 * MiB, "one_shot"), (256 * MiB, "zero_copy")),
        "all_to_all_single": _ALL_TO_ALL,
    },
}

THREADS = 512
MAX_BLOCKS = 64
WIDE_MAX_BLOCKS = 128
#: all_to_all_single: every rank knows only its own sizes, so the grid is fixed: 64 blocks copy
#: the large exchanges fastest and cost the small ones little (RESULTS' grid sweep).
ALL_TO_ALL_BLOCKS = 64
#: all_to_all_single: chunks of at most this many bytes are pushed into the receivers' regions
#: before the call's one barrier; a call with a larger chunk anywhere pulls them after it, and
#: needs a second barrier before its senders may return. Past it pulling is as fast.
ALL_TO_ALL_PUSH_BYTES = 512 << 10
#: The zero-copy all-reduce on 4 or more ranks: a slice per rank past SLICE_BYTES runs on at most
#: SLICE_BLOCKS blocks, where more blocks' loads contend on the links.
SLICE_BYTES = 1 << 20
SLICE_BLOCKS = 64
_WIDE = frozenset({"push", "zero_copy"})
_ONLY_ALL_REDUCE = frozenset({"one_shot_push", "two_shot"})


def fits(op: str, algorithm: str, nbytes: int, world: int, half_bytes: int) -> bool:
    """Whether the kernels can serve a call of ``nbytes`` (staged ones within one region half)."""
    if algorithm == "nccl" or nbytes <= 0:
        return False
    if op == "all_to_all_single":
        return algorithm == "zero_copy"
    if nbytes % (16 * world if op != "all_reduce" else 16):
        return False
    if algorithm == "zero_copy":
        return True
    staged = {
        "one_shot_push": nbytes * world,
        "push": nbytes * (2 if op == "all_reduce" else 1),
    }.get(algorithm, nbytes)
    if op == "all_gather_into_tensor":
        staged = nbytes // world
    return staged <= half_bytes


def applicable(op: str, algorithm: str) -> str:
    """``algorithm`` where ``op`` has it, else the op's nearest one (for forced algorithms)."""
    if op == "all_to_all_single":
        return "zero_copy" if algorithm != "nccl" else "nccl"
    if algorithm in _ONLY_ALL_REDUCE and op != "all_reduce":
        return "one_shot"
    if algorithm == "push" and op == "all_gather_into_tensor":
        return "one_shot"
    return algorithm


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
        op: ``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor`` or
            ``all_to_all_single`` (even splits).
        nbytes: the whole tensor's bytes (see the module docstring).
        world: the group's size.
        half_bytes: the staging capacity per call.
        forced: an algorithm to use wherever the kernels can serve the call.
    """
    if forced is not None:
        forced = applicable(op, forced)
        return forced if fits(op, forced, nbytes, world, half_bytes) else "nccl"
    sizes = [size for size in table if size <= world]
    if not sizes or world < 2:
        return "nccl"
    for bound, algorithm in table[max(sizes)].get(op, ()):
        if nbytes <= bound:
            return algorithm if fits(op, algorithm, nbytes, world, half_bytes) else "nccl"
    return "nccl"


def choose_uneven(table: Mapping[int, Mapping[str, Rows]], world: int, forced: str | None = None) -> str:
    """The algorithm of every all_to_all_single of a group: one per group size, whatever the
    splits and sizes, since each rank knows only its own."""
    if forced is not None:
        return applicable("all_to_all_single", forced)
    sizes = [size for size in table if size <= world]
    if not sizes or world < 2:
        return "nccl"
    rows = table[max(sizes)].get("all_to_all_single", ())
    return rows[-1][1] if rows else "nccl"


def grid_blocks(op: str, algorithm: str, nbytes: int, world: int, max_blocks: int = MAX_BLOCKS) -> int:
    """Blocks of the kernel's grid: a function of the call alone, so equal on every rank."""
    if algorithm in _WIDE:
        max_blocks = WIDE_MAX_BLOCKS
    if op == "all_reduce" and algorithm == "zero_copy" and world >= 4 and nbytes > SLICE_BYTES * world:
        max_blocks = SLICE_BLOCKS
    if op == "all_reduce" and algorithm in ("two_shot", "push", "zero_copy"):
        units = -(-nbytes // world) // 16
    elif op == "all_reduce":
        units = nbytes // 16
    else:
        units = nbytes // world // 16
    return max(1, min(max_blocks, -(-units // THREADS)))
