"""peermem on one host's GPUs: correctness, then timings against NCCL and torch's symmetric memory.

    torchrun --standalone --nproc-per-node N benchmarks/gpu/peermem.py --out DIR [--skip-checks]

In one world, on the same GPUs:
  1. correctness (peermem_checks.py): every algorithm x dtype x op at odd sizes and offsets,
     bursts, side streams, CUDA graphs replayed with new inputs before and after
     register_graph_buffers, all_to_all_single (even, uneven), the fused all-reduce + RMSNorm;
     each kernel-served result bitwise equal to the fixed-order host reference on every rank;
  2. timings, bf16 SUM, 16 B - 256 MiB, us per call, eager back to back and in a CUDA graph: raw
     NCCL (torch.distributed on the same communicator), torch's symmetric-memory one-shot and
     two-shot (as shared/anchors/small_allreduce_anchor.py calls them), and commlayer's default
     backend with its routing and with each algorithm forced; all_gather_into_tensor,
     reduce_scatter_tensor and all_to_all_single against NCCL.
Rank 0 prints tables and writes DIR/gpu_collectives_w{N}.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as torch_dist
from graph_timing import captured, timed
from peermem_checks import STAGES, Checks, run_all

from commlayer import dist
from commlayer.core.types import ReduceOp

KiB, MiB = 1 << 10, 1 << 20
SIZES = [16, 256, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
AR_FORCED = ("one_shot", "one_shot_push", "two_shot", "push", "zero_copy")


def measure(fn, nbytes: int, backend) -> tuple[float, float]:
    iters = int(max(20, min(300, 4e8 / max(nbytes, 1))))
    for _ in range(5):
        fn()
    eager = min(timed(fn, iters) for _ in range(3))
    calls = int(max(5, min(50, 1e8 / max(nbytes, 1))))
    graph = captured(fn, calls, backend)
    replays = max(3, iters // calls)
    in_graph = min(timed(graph.replay, replays) for _ in range(3)) / calls
    del graph
    return eager, in_graph


def methods_for(nbytes: int, world: int, comm, backend, pg, buffers: dict) -> dict:
    """name -> (forced algorithm or "raw", the call)."""
    n = nbytes // 2
    x, o = buffers["plain"][:n], buffers["out"][:n]
    methods = {
        "nccl": ("raw", lambda: torch_dist.all_reduce(x, group=pg)),
        "default": (None, lambda: dist.all_reduce(x)),
        # The backend's own method, without the facade: the facade's share of the host path.
        "direct": (None, lambda: backend.all_reduce(x, ReduceOp.SUM, async_op=False)),
    }
    for name in AR_FORCED:
        methods[name] = (name, lambda: dist.all_reduce(x))
    # Calls the default backend passes to NCCL, against raw NCCL: the facade's cost there.
    methods["ar_passed"] = ("nccl", lambda: dist.all_reduce(x))
    methods["bc_nccl"] = ("raw", lambda: torch_dist.broadcast(x, 0, group=pg))
    methods["bc_default"] = (None, lambda: dist.broadcast(x, 0))
    symm = buffers.get("symm")
    if symm is not None:
        s = symm[:n]
        methods["symm_one_shot"] = (
            "raw",
            lambda: torch.ops.symm_mem.one_shot_all_reduce_out(s, "sum", pg.group_name, o),
        )
        methods["symm_two_shot"] = (
            "raw",
            lambda: torch.ops.symm_mem.two_shot_all_reduce_(s, "sum", pg.group_name),
        )
    chunk = n // world
    if chunk > 0:
        g_in, g_out = buffers["gathered"][:chunk], o[: chunk * world]
        r_in, r_out = buffers["gathered"][: chunk * world], buffers["scattered"][:chunk]
        methods["ag_nccl"] = ("raw", lambda: torch_dist.all_gather_into_tensor(g_out, g_in, group=pg))
        methods["rs_nccl"] = ("raw", lambda: torch_dist.reduce_scatter_tensor(r_out, r_in, group=pg))
        methods["a2a_nccl"] = (
            "raw",
            lambda: torch_dist.all_to_all_single(o[: chunk * world], r_in, group=pg),
        )
        for name in (None, "one_shot", "zero_copy"):
            methods[f"ag_{name or 'default'}"] = (name, lambda: dist.all_gather_into_tensor(g_out, g_in))
        for name in (None, "one_shot", "push", "zero_copy"):
            methods[f"rs_{name or 'default'}"] = (name, lambda: dist.reduce_scatter_tensor(r_out, r_in))
        methods["a2a_default"] = (None, lambda: dist.all_to_all_single(o[: chunk * world], r_in))
        methods["ag_passed"] = ("nccl", lambda: dist.all_gather_into_tensor(g_out, g_in))
        methods["rs_passed"] = ("nccl", lambda: dist.reduce_scatter_tensor(r_out, r_in))
    return methods


def bench(world: int, device: torch.device, backend, pg, rows: list, prefixes: tuple[str, ...] = ()) -> None:
    import torch.distributed._symmetric_memory as symm_mem

    comm = backend.peer_comm
    biggest = max(SIZES) // 2
    buffers = {
        "plain": torch.randn(biggest, device=device).to(torch.bfloat16),
        "out": torch.empty(biggest, dtype=torch.bfloat16, device=device),
        "gathered": torch.randn(biggest, device=device).to(torch.bfloat16),
        "scattered": torch.empty(biggest // world, dtype=torch.bfloat16, device=device),
    }
    try:
        buffers["symm"] = symm_mem.empty(biggest, dtype=torch.bfloat16, device=device)
        symm_mem.rendezvous(buffers["symm"], pg.group_name)
    except Exception as error:  # noqa: BLE001 - the anchor's methods are then reported missing
        print(f"symm-mem unavailable: {type(error).__name__}: {error}", flush=True)
    for nbytes in SIZES:
        for name, (forced, fn) in methods_for(nbytes, world, comm, backend, pg, buffers).items():
            if prefixes and not name.startswith(prefixes):
                continue
            if forced != "raw":
                comm.force(forced)
            try:
                eager, in_graph = measure(fn, nbytes, backend)
                rows.append(
                    {
                        "method": name,
                        "bytes": nbytes,
                        "eager_us": round(eager, 2),
                        "graph_us": round(in_graph, 2),
                    }
                )
            except Exception as error:  # noqa: BLE001 - report and go on with the next method
                rows.append(
                    {"method": name, "bytes": nbytes, "error": f"{type(error).__name__}: {str(error)[:200]}"}
                )
            comm.force(None)
        if dist.get_rank() == 0:
            print(f"timed {nbytes} B", flush=True)


TABLES = {
    "all_reduce": ["nccl", "symm_one_shot", "symm_two_shot", "default", "direct", *AR_FORCED],
    "all_gather / reduce_scatter / all_to_all": [
        "ag_nccl", "ag_default", "ag_one_shot", "ag_zero_copy", "rs_nccl", "rs_default", "rs_one_shot",
        "rs_push", "rs_zero_copy", "a2a_nccl", "a2a_default",
    ],
    "passed to NCCL": ["nccl", "ar_passed", "ag_nccl", "ag_passed", "rs_nccl", "rs_passed", "bc_nccl", "bc_default"],
}  # fmt: skip


def print_tables(rows: list, world: int) -> None:
    for title, names in TABLES.items():
        for key in ("eager_us", "graph_us"):
            print(f"# world {world}, bf16 sum, {title}, {key}")
            print("bytes".rjust(10) + "".join(n[:13].rjust(14) for n in names))
            for nbytes in SIZES:
                cells = {r["method"]: r for r in rows if r.get("bytes") == nbytes}
                line = str(nbytes).rjust(10)
                for n in names:
                    cell = cells.get(n, {})
                    line += (f"{cell[key]:.2f}" if key in cell else ("err" if cell else "-")).rjust(14)
                print(line)
    for r in rows:
        if "error" in r:
            print(json.dumps(r))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--stages", default=",".join(STAGES), help="check stages to run (comma-separated)")
    parser.add_argument(
        "--methods", default="", help="time only methods starting with these (comma-separated)"
    )
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    began = time.time()
    # A kernel whose peer never comes gives up after a minute (CommTimeoutError), not half an hour.
    dist.init_process_group(timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD.backend_for("cuda")
    comm = backend.peer_comm
    report = {"world": world, "backend": backend.name, "serves_locally": comm is not None}
    report.update(device=torch.cuda.get_device_name(), torch=torch.__version__)
    report["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if rank == 0:
        print(json.dumps(report), flush=True)
    if comm is None:
        raise SystemExit("peermem does not serve this world: nothing to check")
    if not args.skip_checks:
        summary = run_all(Checks(comm, rank, world, device), backend, tuple(args.stages.split(",")))
        gathered = [None] * world
        torch_dist.all_gather_object(gathered, summary)
        report["checks_passed"] = sum(s["passed"] for s in gathered)
        report["kernel_served_checks"] = sum(s["kernel_served"] for s in gathered)
        report["check_failures"] = [f for s in gathered for f in s["failures"]]
        if rank == 0:
            print(
                f"checks: {report['checks_passed']} passed, failures: {report['check_failures'][:10]}",
                flush=True,
            )
    rows: list = []
    if not args.skip_bench:
        bench(world, device, backend, backend.torch_group, rows, tuple(filter(None, args.methods.split(","))))
    report["rows"] = rows
    report["seconds"] = round(time.time() - began, 1)
    if rank == 0:
        print_tables(rows, world)
        name = "gpu_checks" if args.skip_bench else "gpu_collectives"
        with open(os.path.join(args.out, f"{name}_w{world}.json"), "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
