"""commlayer against raw torch.distributed on the very same communicator, op by op, size by size.

commlayer's gloo and nccl backends sit on torch's default ProcessGroup, so after
``dist.init_process_group`` both paths drive one communicator; the two are timed in alternating
rounds (best round kept) so neither gets a warmer cache or a quieter neighbour. busbw uses
nccl-tests' factors (commlayer.bench.formulas)::

    torchrun --nproc-per-node 2 benchmarks/torch_vs_commlayer.py --backend nccl --max-bytes 1G
    commlayer run -n 2 benchmarks/torch_vs_commlayer.py --backend gloo --max-bytes 4M
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.bench.formulas import busbw_gbps, format_size, parse_size

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def op_pair(
    op: str, numel: int, world: int, device: torch.device
) -> tuple[Callable[[], object], Callable[[], object]]:
    """(raw torch call, commlayer call) for one op on identical buffers."""
    small = torch.ones(numel, device=device)
    large = torch.ones(numel * world, device=device)
    if op == "all_reduce":
        return (lambda: torch_dist.all_reduce(small)), (lambda: dist.all_reduce(small))
    if op == "broadcast":
        return (lambda: torch_dist.broadcast(small, 0)), (lambda: dist.broadcast(small, 0))
    if op == "all_gather":
        return (lambda: torch_dist.all_gather_into_tensor(large, small)), (
            lambda: dist.all_gather_into_tensor(large, small)
        )
    return (lambda: torch_dist.reduce_scatter_tensor(small, large)), (
        lambda: dist.reduce_scatter_tensor(small, large)
    )


def seconds_per_call(call: Callable[[], object], iters: int, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    _sync(device)
    return (time.perf_counter() - start) / iters


def compare(op: str, nbytes: int, world: int, device: torch.device, rounds: int) -> dict:
    numel = max(1, nbytes // 4)
    raw, ours = op_pair(op, numel, world, device)
    iters = 200 if nbytes < (1 << 20) else (40 if nbytes < (64 << 20) else 8)
    for call in (raw, ours):
        seconds_per_call(call, 5, device)
    best = {"raw": float("inf"), "commlayer": float("inf")}
    for _ in range(rounds):
        best["raw"] = min(best["raw"], seconds_per_call(raw, iters, device))
        best["commlayer"] = min(best["commlayer"], seconds_per_call(ours, iters, device))
    message = numel * 4 * (world if op in ("all_gather", "reduce_scatter") else 1)
    return {
        "op": op,
        "bytes": message,
        "raw_us": best["raw"] * 1e6,
        "commlayer_us": best["commlayer"] * 1e6,
        "raw_busbw_gbps": busbw_gbps(op, message, best["raw"], world),
        "commlayer_busbw_gbps": busbw_gbps(op, message, best["commlayer"], world),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--min-bytes", default="8")
    parser.add_argument("--max-bytes", default="1G")
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = _device(args.backend)
    sizes = _sizes(parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor)
    rows = [compare(op, size, world, device, args.rounds) for op in args.ops.split(",") for size in sizes]
    if rank == 0:
        _print(rows, args.backend, world)
        if args.json:
            with open(args.json, "w") as handle:
                json.dump({"backend": args.backend, "world_size": world, "rows": rows}, handle, indent=1)
    dist.destroy_process_group()


def _print(rows: list[dict], backend: str, world: int) -> None:
    print(f"# commlayer vs torch.distributed, backend={backend}, world={world}, torch {torch.__version__}")
    print(
        f"{'op':<15}{'bytes':>10}{'raw_us':>11}{'cl_us':>11}{'added_us':>10}{'raw_busbw':>11}{'cl_busbw':>10}{'ratio':>8}"
    )
    for row in rows:
        ratio = row["commlayer_busbw_gbps"] / row["raw_busbw_gbps"] if row["raw_busbw_gbps"] else float("nan")
        added = row["commlayer_us"] - row["raw_us"]
        print(
            f"{row['op']:<15}{format_size(row['bytes']):>10}{row['raw_us']:>11.1f}{row['commlayer_us']:>11.1f}"
            f"{added:>10.1f}{row['raw_busbw_gbps']:>11.2f}{row['commlayer_busbw_gbps']:>10.2f}{ratio:>8.3f}",
            flush=True,
        )


def _sizes(low: int, high: int, factor: int) -> list[int]:
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def _device(backend: str) -> torch.device:
    if "nccl" in backend:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
