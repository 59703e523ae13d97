"""Why peermem's slower calls are slower: grid sweeps and kernel times against the references.

    torchrun --standalone --nproc-per-node N benchmarks/gpu/peermem_profile.py --out DIR

In one world, bf16, CUDA graphs of back-to-back calls (the launch cost out of the figure):
  1. all_reduce on the zero-copy kernel at every grid size it may use, 16 B - 16 MiB, against
     torch's symmetric-memory two-shot (on its own buffer, as the anchor calls it) and NCCL: what
     the kernel's fixed cost is (16 B) and whether more or fewer blocks would close the gap;
  2. all_to_all_single (even splits) on peermem's kernel at every grid size, and with its chunks
     pulled after the barrier or pushed before it (up to a few limits), against NCCL;
  3. one eager call of each under ``torch.profiler``: the kernel's own duration, so that the rest
     of an eager call's time is the host's.
Rank 0 prints the tables and writes DIR/peermem_profile_w{N}.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as torch_dist
from graph_timing import captured, timed
from torch.profiler import ProfilerActivity, profile

from commlayer import dist
from commlayer.core.types import ReduceOp

KiB, MiB = 1 << 10, 1 << 20
ALL_REDUCE_SIZES = (16, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB)
ALL_TO_ALL_SIZES = (4 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB)
GRIDS = (4, 8, 16, 32, 64, 128)
#: all_to_all_single's chunks pushed before the one barrier up to these sizes (0: every chunk pulled).
PUSH_LIMITS = {"pull": 0, "push_256KiB": 256 * KiB, "push_1MiB": MiB, "push_slot": 1 << 62}


def graphed_us(fn: Callable[[], object], nbytes: int, backend) -> float:
    """Microseconds per call of ``fn`` replayed in a CUDA graph of back-to-back calls."""
    calls = int(max(5, min(50, 1e8 / max(nbytes, 1))))
    graph = captured(fn, calls, backend)
    replays = max(3, int(max(20, min(300, 4e8 / max(nbytes, 1)))) // calls)
    best = min(timed(graph.replay, replays) for _ in range(3)) / calls
    del graph
    return round(best, 2)


def kernel_us(fn: Callable[[], object], calls: int = 20) -> dict[str, float]:
    """Mean device duration of each kernel ``fn`` launches, over ``calls`` eager calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_time_total > 0:
            totals[event.key[:60]] = round(event.device_time_total / calls, 2)
    return totals


def all_reduce_row(nbytes: int, comm, backend, pg, buffers: dict) -> dict:
    n = nbytes // 2
    x, s = buffers["plain"][:n], buffers["symm"][:n]
    references = {
        "nccl": lambda: torch_dist.all_reduce(x, group=pg),
        "symm_two_shot": lambda: torch.ops.symm_mem.two_shot_all_reduce_(s, "sum", pg.group_name),
    }
    row = {"op": "all_reduce", "bytes": nbytes}
    row.update({name: graphed_us(fn, nbytes, backend) for name, fn in references.items()})
    comm.force("zero_copy")
    route = comm.route("all_reduce", nbytes, torch.bfloat16, ReduceOp.SUM)
    row["routed_grid"] = route.blocks

    def on_grid(grid: int) -> Callable[[], object]:
        swept = route._replace(blocks=grid)
        return lambda: comm.launch(swept, x, x, nbytes, False)

    for grid in GRIDS:
        row[f"grid_{grid}"] = graphed_us(on_grid(grid), nbytes, backend)
    if nbytes == MiB:
        row["kernels_zero_copy"] = kernel_us(on_grid(route.blocks))
        row["kernels_two_shot"] = kernel_us(references["symm_two_shot"])
    comm.force(None)
    return row


def all_to_all_row(nbytes: int, comm, backend, pg, buffers: dict) -> dict:
    n = nbytes // 2
    source, output = buffers["plain"][:n], buffers["out"][:n]
    nccl = lambda: torch_dist.all_to_all_single(output, source, group=pg)
    # The backend's own entry, which reads the grid and push limit per call: the facade's C fast
    # path fixes both when it is built.
    peermem = lambda: backend.all_to_all_single(output, source, None, None, async_op=False)
    row = {"op": "all_to_all_single", "bytes": nbytes, "nccl": graphed_us(nccl, nbytes, backend)}
    routed = comm.all_to_all_blocks
    for grid in GRIDS:
        comm.all_to_all_blocks = grid
        row[f"grid_{grid}"] = graphed_us(peermem, nbytes, backend)
    comm.all_to_all_blocks = routed
    row["routed_grid"] = routed
    pushed = comm.all_to_all_push_bytes
    for label, limit in PUSH_LIMITS.items():
        comm.all_to_all_push_bytes = limit
        row[label] = graphed_us(peermem, nbytes, backend)
    comm.all_to_all_push_bytes = pushed
    row["routed_push_bytes"] = pushed
    if nbytes == MiB:
        row["kernels_peermem"] = kernel_us(peermem)
        row["kernels_nccl"] = kernel_us(nccl)
    return row


def rows_of(make_row: Callable[..., dict], sizes: tuple[int, ...], *context) -> list[dict]:
    rows = []
    for nbytes in sizes:
        rows.append(make_row(nbytes, *context))
        if dist.get_rank() == 0:
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group(timeout=timedelta(seconds=60))
    world = dist.get_world_size()
    backend = dist.group.WORLD.backend_for("cuda")
    comm, pg = backend.peer_comm, backend.torch_group
    if comm is None:
        raise SystemExit("peermem does not serve this world: nothing to profile")
    import torch.distributed._symmetric_memory as symm_mem

    biggest = max(ALL_REDUCE_SIZES + ALL_TO_ALL_SIZES) // 2
    buffers = {
        "plain": torch.randn(biggest, device=device).to(torch.bfloat16),
        "out": torch.empty(biggest, dtype=torch.bfloat16, device=device),
        "symm": symm_mem.empty(biggest, dtype=torch.bfloat16, device=device),
    }
    symm_mem.rendezvous(buffers["symm"], pg.group_name)
    report = {"world": world, "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    context = (comm, backend, pg, buffers)
    report["rows"] = rows_of(all_reduce_row, ALL_REDUCE_SIZES, *context) + rows_of(
        all_to_all_row, ALL_TO_ALL_SIZES, *context
    )
    if dist.get_rank() == 0:
        with open(os.path.join(args.out, f"peermem_profile_w{world}.json"), "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
