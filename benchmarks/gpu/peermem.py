# ruff: noqa: B023 - each timed lambda runs only inside the loop iteration that made it
"""peermem on one host's GPUs: correctness, CUDA graphs, and timings against NCCL and torch symm-mem.

    torchrun --standalone --nproc-per-node N benchmarks/gpu/peermem.py --out DIR [--skip-bench] [--tp]

In one run, on the same GPUs:
  1. correctness: every forced algorithm (one-shot, two-shot) x dtype (fp32, bf16, fp16) x op
     (sum, avg, min, max, product) x size for all_reduce, all_gather_into_tensor and
     reduce_scatter_tensor through ``commlayer.dist`` on the default backend, each result compared
     bitwise with the fixed-order host reference (equal to it on every rank means equal across
     ranks); a mixed sequence of sizes and ops; CUDA-graph capture and replays;
  2. timings (16 B .. 64 MiB, bf16, sum; us per call, eager back to back and in a CUDA graph):
     shared/anchors/small_allreduce_anchor.py's methods -- raw torch NCCL, torch symm-mem one-shot
     and two-shot -- beside commlayer's default and each of its forced algorithms;
  3. with --tp, a tensor-parallel decode step (Llama-style block, hidden 8192) on commlayer's
     default against NCCL.
Rank 0 prints tables and writes DIR/gpu_collectives_w{N}.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.backends.peermem.reference import fixed_order_reduce
from commlayer.core.types import ReduceOp

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT]
SIZES = [16, 256, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def rank_input(rank: int, numel: int, dtype: torch.dtype, case: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * case + rank)
    return torch.randn(numel, generator=generator).to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool((a.cpu().view(torch.uint8) == b.cpu().view(torch.uint8)).all())


class Checks:
    def __init__(self, rank: int, world: int, device: torch.device) -> None:
        self.rank, self.world, self.device = rank, world, device
        self.case, self.passed, self.failures = 0, 0, []
        self.comm, self.kernel_calls = None, 0

    def served(self, op: str, nbytes: int, dtype: torch.dtype, reduce_op: ReduceOp) -> bool:
        """Whether the kernels (not NCCL) serve this call: then the result must be bitwise exact."""
        served = self.comm.route(op, nbytes, dtype, reduce_op) is not None
        self.kernel_calls += served
        return served

    def inputs(self, numel: int, dtype: torch.dtype) -> list[torch.Tensor]:
        self.case += 1
        return [rank_input(r, numel, dtype, self.case) for r in range(self.world)]

    def expect(self, label: str, got: torch.Tensor, want: torch.Tensor, exact: bool = True) -> None:
        # A call the routing sends to NCCL reduces in NCCL's order: equal to rounding only.
        if same_bits(got, want) or (
            not exact and torch.allclose(got.cpu().float(), want.float(), rtol=2e-2, atol=1e-2)
        ):
            self.passed += 1
        else:
            diff = (got.cpu().float() - want.float()).abs().max().item()
            self.failures.append(f"rank {self.rank} {label}: max |diff| {diff}")

    def all_reduce(self, numel: int, dtype: torch.dtype, op: ReduceOp, label: str) -> None:
        inputs = self.inputs(numel, dtype)
        tensor = inputs[self.rank].to(self.device)
        dist.all_reduce(tensor, op=op)
        exact = self.served("all_reduce", tensor.numel() * tensor.element_size(), dtype, op)
        self.expect(
            f"all_reduce {label} {op.name} {dtype} n={numel}", tensor, fixed_order_reduce(inputs, op), exact
        )

    def all_gather(self, numel: int, dtype: torch.dtype, label: str) -> None:
        inputs = self.inputs(numel, dtype)
        output = torch.full((self.world * numel,), float("nan"), dtype=dtype, device=self.device)
        dist.all_gather_into_tensor(output, inputs[self.rank].to(self.device))
        self.expect(f"all_gather {label} {dtype} n={numel}", output, torch.cat(inputs))

    def reduce_scatter(self, numel: int, dtype: torch.dtype, op: ReduceOp, label: str) -> None:
        inputs = self.inputs(self.world * numel, dtype)
        output = torch.full((numel,), float("nan"), dtype=dtype, device=self.device)
        dist.reduce_scatter_tensor(output, inputs[self.rank].to(self.device), op=op)
        chunks = [t[self.rank * numel : (self.rank + 1) * numel] for t in inputs]
        exact = self.served("reduce_scatter_tensor", self.world * numel * output.element_size(), dtype, op)
        want = fixed_order_reduce(chunks, op)
        self.expect(f"reduce_scatter {label} {op.name} {dtype} n={numel}", output, want, exact)


def correctness(checks: Checks, comm, world: int) -> None:
    numels = {
        torch.float32: [4, 4 * 1001, 65536 * 3 + 4, 1 << 20],
        torch.bfloat16: [8, 8 * 1001, 65536 * 3 + 8, 1 << 21],
    }
    numels[torch.float16] = numels[torch.bfloat16]
    for forced in ("one_shot", "two_shot", "push", None):
        comm.forced, comm._routes = forced, {}
        label = forced or "default"
        for dtype in DTYPES.values():
            for numel in numels[dtype]:
                for op in OPS:
                    checks.all_reduce(numel, dtype, op, label)
                if forced in ("one_shot", "push", None):
                    checks.all_gather(numel, dtype, label)
                    for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX):
                        checks.reduce_scatter(numel, dtype, op, label)
    comm.forced, comm._routes = None, {}
    # A sequence of changing sizes, grids and ops: the epoch and staging halves must stay in step.
    for step in range(60):
        numel = [8, 4096, 65536, 8 * 1001, 1 << 19][step % 5]
        op = OPS[step % len(OPS)]
        comm.forced, comm._routes = ("one_shot", "two_shot", "push")[step % 3], {}
        checks.all_reduce(numel, torch.bfloat16, op, f"sequence {step}")
    comm.forced, comm._routes = None, {}


def graph_checks(checks: Checks, world: int, device: torch.device) -> None:
    """Capture default-backend calls in one graph and check every replay against fresh inputs."""
    numels = [8, 4096, 1 << 19]  # bf16: 16 B, 8 KiB, 1 MiB
    tensors = [torch.empty(n, dtype=torch.bfloat16, device=device) for n in numels]
    gather_in = torch.empty(2048, dtype=torch.bfloat16, device=device)
    gather_out = torch.empty(2048 * world, dtype=torch.bfloat16, device=device)
    scatter_in = torch.empty(2048 * world, dtype=torch.bfloat16, device=device)
    scatter_out = torch.empty(2048, dtype=torch.bfloat16, device=device)

    def body() -> None:
        for tensor in tensors:
            dist.all_reduce(tensor)
        dist.all_gather_into_tensor(gather_out, gather_in)
        dist.reduce_scatter_tensor(scatter_out, scatter_in)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for replay in range(3):
        inputs = [checks.inputs(n, torch.bfloat16) for n in numels]
        for tensor, ranks in zip(tensors, inputs):
            tensor.copy_(ranks[checks.rank])
        gathers = checks.inputs(2048, torch.bfloat16)
        gather_in.copy_(gathers[checks.rank])
        scatters = checks.inputs(2048 * world, torch.bfloat16)
        scatter_in.copy_(scatters[checks.rank])
        graph.replay()
        torch.cuda.synchronize()
        for tensor, ranks in zip(tensors, inputs):
            checks.expect(
                f"graph replay {replay} all_reduce n={tensor.numel()}",
                tensor,
                fixed_order_reduce(ranks, ReduceOp.SUM),
            )
        checks.expect(f"graph replay {replay} all_gather", gather_out, torch.cat(gathers))
        chunks = [t[checks.rank * 2048 : (checks.rank + 1) * 2048] for t in scatters]
        checks.expect(
            f"graph replay {replay} reduce_scatter", scatter_out, fixed_order_reduce(chunks, ReduceOp.SUM)
        )


def timed(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch_dist.barrier()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def graphed(fn, calls: int) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def measure(fn, nbytes: int) -> tuple[float, float]:
    iters = int(max(20, min(300, 4e8 / max(nbytes, 1))))
    for _ in range(5):
        fn()
    eager = min(timed(fn, iters) for _ in range(3))
    calls = int(max(5, min(50, 1e8 / max(nbytes, 1))))
    graph = graphed(fn, calls)
    replays = max(3, iters // calls)
    in_graph = min(timed(graph.replay, replays) for _ in range(3)) / calls
    del graph
    return eager, in_graph


def bench(rank: int, world: int, device: torch.device, backend, pg, rows: list) -> None:
    import torch.distributed._symmetric_memory as symm_mem

    comm = backend._comm
    dtype = torch.bfloat16
    biggest = max(SIZES) // 2
    symm = None
    try:
        symm = symm_mem.empty(biggest, dtype=dtype, device=device)
        symm_mem.rendezvous(symm, pg.group_name)
    except Exception as error:  # noqa: BLE001 - the anchor's methods are then reported missing
        if rank == 0:
            print(f"symm-mem unavailable: {type(error).__name__}: {error}")
        symm = None
    plain = torch.randn(biggest, device=device).to(dtype)
    out = torch.empty_like(plain)
    gathered = torch.randn(biggest, device=device).to(dtype)
    scattered = torch.empty(biggest // world, dtype=dtype, device=device)

    def forced(name):
        def use():
            comm.forced, comm._routes = name, {}

        return use

    for nbytes in SIZES:
        n = nbytes // 2
        x, o = plain[:n], out[:n]
        chunk = n // world
        methods = {
            "nccl": (None, lambda: torch_dist.all_reduce(x, group=pg)),
            "default": (forced(None), lambda: dist.all_reduce(x)),
            "cl_one_shot": (forced("one_shot"), lambda: dist.all_reduce(x)),
            "cl_two_shot": (forced("two_shot"), lambda: dist.all_reduce(x)),
            "cl_push": (forced("push"), lambda: dist.all_reduce(x)),
            # The backend's own method, without the facade: the facade's share of the host path.
            "cl_direct": (forced(None), lambda: backend.all_reduce(x, ReduceOp.SUM, async_op=False).wait()),
        }
        if symm is not None:
            s = symm[:n]
            methods["one_shot"] = (
                None,
                lambda: torch.ops.symm_mem.one_shot_all_reduce_out(s, "sum", pg.group_name, o),
            )
            methods["two_shot"] = (
                None,
                lambda: torch.ops.symm_mem.two_shot_all_reduce_(s, "sum", pg.group_name),
            )
        if chunk > 0:
            g_in, g_out = gathered[:chunk], out[: chunk * world]
            methods["ag_nccl"] = (None, lambda: torch_dist.all_gather_into_tensor(g_out, g_in, group=pg))
            methods["ag_default"] = (forced(None), lambda: dist.all_gather_into_tensor(g_out, g_in))
            r_in, r_out = gathered[: chunk * world], scattered[:chunk]
            methods["rs_nccl"] = (None, lambda: torch_dist.reduce_scatter_tensor(r_out, r_in, group=pg))
            methods["rs_default"] = (forced(None), lambda: dist.reduce_scatter_tensor(r_out, r_in))
            methods["rs_cl_one"] = (forced("one_shot"), lambda: dist.reduce_scatter_tensor(r_out, r_in))
            methods["rs_cl_push"] = (forced("push"), lambda: dist.reduce_scatter_tensor(r_out, r_in))
        for name, (setup, fn) in methods.items():
            try:
                if setup:
                    setup()
                eager, in_graph = measure(fn, nbytes)
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
        comm.forced, comm._routes = None, {}


def tp_decode(rank: int, world: int, device: torch.device, comm, rows: list) -> None:
    """A Llama-style block's decode step (hidden 8192, 4 layers), tensor-parallel over the world."""
    hidden, inter, kv, layers = 8192, 28672, 1024, 4
    dtype = torch.bfloat16
    torch.manual_seed(rank)
    weights = [
        (
            torch.randn(hidden, (hidden + 2 * kv) // world, device=device, dtype=dtype) * 0.01,
            torch.randn(hidden // world, hidden, device=device, dtype=dtype) * 0.01,
            torch.randn(hidden, 2 * inter // world, device=device, dtype=dtype) * 0.01,
            torch.randn(inter // world, hidden, device=device, dtype=dtype) * 0.01,
        )
        for _ in range(layers)
    ]

    def step(x: torch.Tensor) -> torch.Tensor:
        for qkv, o_proj, gate_up, down in weights:
            h = torch.nn.functional.rms_norm(x, (hidden,))
            q = (h @ qkv)[:, : hidden // world]
            a = q @ o_proj
            dist.all_reduce(a)
            x = x + a
            h = torch.nn.functional.rms_norm(x, (hidden,))
            g, u = (h @ gate_up).chunk(2, dim=-1)
            m = (torch.nn.functional.silu(g) * u) @ down
            dist.all_reduce(m)
            x = x + m
        return x

    for batch in (1, 2, 4, 8, 16):
        x = torch.randn(batch, hidden, device=device, dtype=dtype)
        for name in ("nccl", None):
            comm.forced, comm._routes = name, {}
            eager, in_graph = measure(lambda: step(x), batch * hidden * 2)
            rows.append(
                {
                    "method": f"tp_decode_{name or 'default'}",
                    "batch": batch,
                    "eager_us": round(eager, 2),
                    "graph_us": round(in_graph, 2),
                    "tokens_per_s_graph": round(batch / in_graph * 1e6, 1),
                    "tokens_per_s_eager": round(batch / eager * 1e6, 1),
                }
            )
    comm.forced, comm._routes = None, {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--tp", action="store_true")
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    began = time.time()
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.group.WORLD.backend_for("cuda")
    comm = backend._comm
    report = {
        "world": world,
        "backend": backend.name,
        "serves_locally": comm is not None,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if rank == 0:
        print(json.dumps(report), flush=True)
    checks = Checks(rank, world, device)
    checks.comm = comm
    correctness(checks, comm, world)
    graph_checks(checks, world, device)
    torch.cuda.synchronize()
    counts = [None] * world
    torch_dist.all_gather_object(counts, (checks.passed, checks.failures[:5]))
    report["checks_passed"] = sum(c[0] for c in counts)
    report["kernel_served_checks"] = checks.kernel_calls
    report["note"] = (
        "reductions the table sends to NCCL are checked to rounding; every kernel-served one bitwise"
    )
    report["check_failures"] = [f for c in counts for f in c[1]]
    if rank == 0:
        print(
            f"checks: {report['checks_passed']} passed, failures: {report['check_failures'][:10]}", flush=True
        )
    rows: list = []
    pg = backend.torch_group
    if not args.skip_bench:
        bench(rank, world, device, backend, pg, rows)
    if args.tp:
        tp_decode(rank, world, device, comm, rows)
    report["rows"] = rows
    report["seconds"] = round(time.time() - began, 1)
    if rank == 0:
        print_tables(rows, world)
        with open(os.path.join(args.out, f"gpu_collectives_w{world}.json"), "w") as f:
            json.dump(report, f, indent=1)
    dist.destroy_process_group()


def print_tables(rows: list, world: int) -> None:
    names = [
        "nccl",
        "one_shot",
        "two_shot",
        "default",
        "cl_direct",
        "cl_one_shot",
        "cl_two_shot",
        "cl_push",
        "ag_nccl",
        "ag_default",
        "rs_nccl",
        "rs_default",
        "rs_cl_one",
        "rs_cl_push",
    ]
    for key in ("eager_us", "graph_us"):
        print(f"# world {world}, bf16 sum, {key}")
        print("bytes".rjust(9) + "".join(n.rjust(12) for n in names))
        for nbytes in SIZES:
            cells = {r["method"]: r for r in rows if r.get("bytes") == nbytes}
            print(
                str(nbytes).rjust(9)
                + "".join(
                    (
                        f"{cells[n][key]:.2f}"
                        if n in cells and key in cells[n]
                        else ("err" if n in cells else "-")
                    ).rjust(12)
                    for n in names
                )
            )
    for r in rows:
        if "batch" in r or "error" in r:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
