"""peermem's correctness checks on GPUs, run by benchmarks/gpu/peermem.py inside one world.

Every kernel-served result must equal the fixed-order host reference bitwise (on every rank, so
the ranks agree bitwise too); a result NCCL serves must lie within the rounding bound of any order
(reference.rounding_bound). Covered: every algorithm x dtype x op at odd sizes, views at offsets
(aligned and not), bursts of calls with changing inputs, CUDA-graph replays with new inputs before
and after register_graph_buffers, side streams, asynchronous calls on the group's stream,
all_to_all_single with even and uneven splits (pushed and pulled), and the fused all-reduce +
residual + RMSNorm.
"""

from __future__ import annotations

import torch
from graph_timing import captured

from commlayer import dist
from commlayer.backends.peermem.reference import fixed_order_reduce, fused_reference, within_bound
from commlayer.core.types import ReduceOp
from commlayer.parallel import all_reduce_residual_rms_norm

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
OPS = (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)
ALGORITHMS = ("one_shot", "one_shot_push", "two_shot", "push", "zero_copy", None)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return (
        a.shape == b.shape and a.dtype == b.dtype and bool((a.view(torch.uint8) == b.view(torch.uint8)).all())
    )


class Checks:
    """Draws every rank's inputs on every rank (same seeds) and records each check's outcome."""

    def __init__(self, comm, rank: int, world: int, device: torch.device) -> None:
        self.comm, self.rank, self.world, self.device = comm, rank, world, device
        self.case, self.passed, self.kernel_served, self.failures = 0, 0, 0, []

    def inputs(self, numel: int, dtype: torch.dtype) -> list[torch.Tensor]:
        self.case += 1
        out = []
        for r in range(self.world):
            generator = torch.Generator().manual_seed(1000 * self.case + r)
            if dtype.is_floating_point:
                out.append(torch.randn(numel, generator=generator).to(dtype))
            else:
                out.append(torch.randint(-100, 100, (numel,), generator=generator).to(dtype))
        return out

    def expect_bits(self, label: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if same_bits(got, want):
            self.passed += 1
        else:
            diff = (got.detach().cpu().double() - want.double()).abs().max().item()
            self.failures.append(f"rank {self.rank} {label}: max |diff| {diff}")

    def expect_reduced(
        self, label: str, got: torch.Tensor, inputs: list[torch.Tensor], op: ReduceOp, kernel: bool
    ):
        if kernel:
            self.kernel_served += 1
            self.expect_bits(label, got, fixed_order_reduce(inputs, op))
            return
        ok, worst = within_bound(got, inputs, op)
        if ok:
            self.passed += 1
        else:
            self.failures.append(f"rank {self.rank} {label}: NCCL result {worst:.2f}x the rounding bound")

    def force(self, algorithm: str | None) -> None:
        self.comm.force(algorithm)

    def served(self, op: str, nbytes: int, dtype: torch.dtype, reduce_op: ReduceOp | None) -> bool:
        return self.comm.route(op, nbytes, dtype, reduce_op) is not None

    def all_reduce(self, numel: int, dtype: torch.dtype, op: ReduceOp, label: str, offset: int = 0) -> None:
        inputs = self.inputs(numel, dtype)
        buffer = torch.empty(numel + offset, dtype=dtype, device=self.device)
        tensor = buffer[offset:]
        tensor.copy_(inputs[self.rank])
        dist.all_reduce(tensor, op=op)
        kernel = self.served("all_reduce", numel * tensor.element_size(), dtype, op)
        self.expect_reduced(
            f"all_reduce {label} {op.name} {dtype} n={numel}+{offset}", tensor, inputs, op, kernel
        )

    def all_gather(self, numel: int, dtype: torch.dtype, label: str, offset: int = 0) -> None:
        inputs = self.inputs(numel, dtype)
        output = torch.full((self.world * numel + offset,), float("nan"), dtype=dtype, device=self.device)[
            offset:
        ]
        dist.all_gather_into_tensor(output, inputs[self.rank].to(self.device))
        self.expect_bits(f"all_gather {label} {dtype} n={numel}+{offset}", output, torch.cat(inputs))

    def reduce_scatter(self, numel: int, dtype: torch.dtype, op: ReduceOp, label: str) -> None:
        inputs = self.inputs(self.world * numel, dtype)
        output = torch.full((numel,), float("nan"), dtype=dtype, device=self.device)
        dist.reduce_scatter_tensor(output, inputs[self.rank].to(self.device), op=op)
        chunks = [t[self.rank * numel : (self.rank + 1) * numel] for t in inputs]
        kernel = self.served("reduce_scatter_tensor", self.world * numel * output.element_size(), dtype, op)
        self.expect_reduced(f"reduce_scatter {label} {op.name} {dtype} n={numel}", output, chunks, op, kernel)

    def all_to_all(self, rows: list[list[int]], width: int, dtype: torch.dtype, label: str) -> None:
        """rows[p][q]: rows rank p sends to rank q (uneven unless all equal)."""
        sends = rows[self.rank]
        receives = [rows[p][self.rank] for p in range(self.world)]
        inputs = [self.inputs(sum(rows[p]) * width, dtype)[p].view(-1, width) for p in range(self.world)]
        output = torch.full((sum(receives), width), 7, dtype=dtype, device=self.device)
        even = len({n for row in rows for n in row}) == 1
        splits = (None, None) if even else (receives, sends)
        dist.all_to_all_single(output, inputs[self.rank].to(self.device), *splits)
        want = torch.cat(
            [inputs[p][sum(rows[p][: self.rank]) : sum(rows[p][: self.rank + 1])] for p in range(self.world)]
        )
        self.expect_bits(f"all_to_all {label} {dtype} rows={sends}->{receives} x{width}", output, want)


def collectives(checks: Checks) -> None:
    numels = {
        torch.float32: [4, 4 * 1001, 65536 * 3 + 4, 1 << 20],
        torch.bfloat16: [8, 8 * 1001, 65536 * 3 + 8, 1 << 21],
    }
    numels[torch.float16] = numels[torch.bfloat16]
    for algorithm in ALGORITHMS:
        checks.force(algorithm)
        label = algorithm or "default"
        for dtype in DTYPES:
            for numel in numels[dtype]:
                for op in OPS:
                    checks.all_reduce(numel, dtype, op, label)
                checks.all_gather(numel, dtype, label)
                for op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MAX):
                    checks.reduce_scatter(numel, dtype, op, label)
    for algorithm in ("one_shot", "zero_copy", None):  # views: aligned at an offset, and unaligned
        checks.force(algorithm)
        for offset in (64, 1):
            checks.all_reduce(65536 + 8, torch.bfloat16, ReduceOp.SUM, f"view {algorithm}", offset)
            checks.all_gather(4096, torch.bfloat16, f"view {algorithm}", offset)
    checks.force("zero_copy")  # larger than a staging half: rounds while unregistered, then in place
    for repeat in range(3):
        checks.all_reduce(20 << 20, torch.bfloat16, ReduceOp.SUM, f"rounds {repeat}")
        checks.reduce_scatter(10 << 20, torch.bfloat16, ReduceOp.SUM, f"rounds {repeat}")
        checks.all_gather(10 << 20, torch.bfloat16, f"rounds {repeat}")
    checks.force("nccl")  # NCCL's own order: within the rounding bound (the bf16 16 MiB case)
    checks.reduce_scatter(1 << 22, torch.bfloat16, ReduceOp.SUM, "nccl")
    checks.all_reduce(1 << 22, torch.bfloat16, ReduceOp.SUM, "nccl")
    checks.force(None)


def bursts(checks: Checks) -> None:
    """Calls back to back with no sync, changing sizes, ops and algorithms; checked at the end."""
    pending = []
    for step in range(60):
        numel = [8, 4096, 65536, 8 * 1001, 1 << 19][step % 5]
        op = OPS[step % len(OPS)]
        checks.force(("one_shot", "one_shot_push", "two_shot", "push", "zero_copy")[step % 5])
        inputs = checks.inputs(numel, torch.bfloat16)
        tensor = inputs[checks.rank].to(checks.device)
        dist.all_reduce(tensor, op=op)
        pending.append((step, op, inputs, tensor, checks.served("all_reduce", numel * 2, torch.bfloat16, op)))
    torch.cuda.synchronize()
    for step, op, inputs, tensor, kernel in pending:
        checks.expect_reduced(f"burst {step} {op.name}", tensor, inputs, op, kernel)
    checks.force(None)


def side_streams(checks: Checks) -> None:
    stream = torch.cuda.Stream()
    for numel in (4096, 1 << 20, 4 << 20):
        inputs = checks.inputs(numel, torch.bfloat16)
        tensor = inputs[checks.rank].to(checks.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            work = dist.all_reduce(tensor, async_op=True)
        work.wait()  # the current stream now waits for the side stream's kernel
        kernel = checks.served("all_reduce", numel * 2, torch.bfloat16, ReduceOp.SUM)
        checks.expect_reduced(f"side stream n={numel}", tensor.clone(), inputs, ReduceOp.SUM, kernel)


def async_calls(checks: Checks) -> None:
    """async_op=True calls of every size, back to back: the large ones run on the group's stream.
    Each source is a temporary freed at once and its block refilled, which a kernel still reading
    it would see; every result is checked after the waits (some through the Work's future)."""
    pending = []
    for step in range(12):
        numel = [4096, 1 << 20, 4 << 20][step % 3]
        reduced = checks.inputs(numel, torch.bfloat16)
        tensor = reduced[checks.rank].to(checks.device)
        reduce_work = dist.all_reduce(tensor, async_op=True)
        gathered = checks.inputs(numel // checks.world, torch.bfloat16)
        output = torch.empty(numel, dtype=torch.bfloat16, device=checks.device)
        gather_work = dist.all_gather_into_tensor(
            output, gathered[checks.rank].to(checks.device), async_op=True
        )
        torch.full((numel // checks.world,), float(step), dtype=torch.bfloat16, device=checks.device)
        kernel = checks.served("all_reduce", numel * 2, torch.bfloat16, ReduceOp.SUM)
        pending.append((step, reduce_work, tensor, reduced, kernel, gather_work, output, gathered))
    for step, reduce_work, tensor, reduced, kernel, gather_work, output, gathered in pending:
        if step % 4 == 3:  # through the Work's future and a callback, as DDP's comm hooks take it
            doubled = reduce_work.get_future().then(lambda future: future.value()[0] * 2).wait()
            tensor = doubled / 2
        else:
            reduce_work.wait()
        gather_work.wait()
        checks.expect_reduced(f"async {step} all_reduce", tensor, reduced, ReduceOp.SUM, kernel)
        checks.expect_bits(f"async {step} all_gather", output, torch.cat(gathered))


def all_to_alls(checks: Checks) -> None:
    world = checks.world
    even = [[3] * world for _ in range(world)]
    uneven = [[(p + 2 * q) % 4 for q in range(world)] for p in range(world)]  # zero-length chunks too
    for dtype in (torch.bfloat16, torch.float32, torch.int64, torch.uint8):
        checks.all_to_all(even, 1024, dtype, "even")
        checks.all_to_all(uneven, 1024, dtype, "uneven")
        checks.all_to_all(uneven, 7, dtype, "uneven odd bytes")
    # Chunks up to the push limit go before the barrier; one rank's larger chunk makes every rank pull.
    at_limit = checks.comm.all_to_all_push_bytes // 2048  # rows of 1024 bf16
    checks.all_to_all([[at_limit] * world for _ in range(world)], 1024, torch.bfloat16, "pushed at the limit")
    mixed = [[1 + q for q in range(world)] for _ in range(world)]
    mixed[0][1] = at_limit + 1
    checks.all_to_all(mixed, 1024, torch.bfloat16, "one rank pulls")
    big = [[1 + p + q for q in range(world)] for p in range(world)]
    for repeat in range(3):  # larger than a region half: rounds while unregistered, then in place
        checks.all_to_all(big, 2 << 20, torch.bfloat16, f"rounds {repeat}")


def fused(checks: Checks) -> None:
    for rows, hidden, dtype in ((1, 4096, torch.bfloat16), (7, 8192, torch.bfloat16), (16, 4096, torch.bfloat16),
                                (3, 1024, torch.float32), (5, 2048, torch.float16)):  # fmt: skip
        partials = [p.view(rows, hidden) for p in checks.inputs(rows * hidden, dtype)]
        residual = checks.inputs(rows * hidden, dtype)[0].view(rows, hidden)
        weight = checks.inputs(hidden, dtype)[0]
        device = checks.device
        normed, residual_out = all_reduce_residual_rms_norm(
            partials[checks.rank].to(device), residual.to(device), weight.to(device), 1e-6
        )
        want_normed, want_residual = fused_reference(partials, residual, weight, 1e-6)
        checks.expect_bits(f"fused residual {rows}x{hidden} {dtype}", residual_out, want_residual)
        checks.expect_bits(f"fused normed {rows}x{hidden} {dtype}", normed, want_normed)


def graphs(checks: Checks, backend, algorithm: str | None) -> None:
    """One graph of every kind of call; replays with fresh inputs, before and after registration."""
    world, device, dtype = checks.world, checks.device, torch.bfloat16
    checks.force(algorithm)
    numels = [8, 4096, 1 << 19, 4 << 20]
    tensors = [torch.empty(n, dtype=dtype, device=device) for n in numels]
    gather_in = torch.empty(1 << 18, dtype=dtype, device=device)
    gather_out = torch.empty((1 << 18) * world, dtype=dtype, device=device)
    scatter_in = torch.empty((1 << 18) * world, dtype=dtype, device=device)
    scatter_out = torch.empty(1 << 18, dtype=dtype, device=device)
    a2a_in = torch.empty(world * 4096, dtype=dtype, device=device)
    a2a_out = torch.empty(world * 4096, dtype=dtype, device=device)
    rows, hidden = 4, 4096
    partial = torch.empty(rows, hidden, dtype=dtype, device=device)
    residual = torch.empty(rows, hidden, dtype=dtype, device=device)
    weight = torch.empty(hidden, dtype=dtype, device=device)
    results = {}

    def body() -> None:
        for tensor in tensors:
            dist.all_reduce(tensor)
        dist.all_gather_into_tensor(gather_out, gather_in)
        dist.reduce_scatter_tensor(scatter_out, scatter_in)
        dist.all_to_all_single(a2a_out, a2a_in)
        results["fused"] = all_reduce_residual_rms_norm(partial, residual, weight)

    graph = captured(body, warmup=1)
    for replay in range(4):
        if replay == 2:
            results["registered"] = backend.register_graph_buffers()
        inputs = [checks.inputs(n, dtype) for n in numels]
        for tensor, ranks in zip(tensors, inputs):
            tensor.copy_(ranks[checks.rank])
        gathers = checks.inputs(1 << 18, dtype)
        gather_in.copy_(gathers[checks.rank])
        scatters = checks.inputs((1 << 18) * world, dtype)
        scatter_in.copy_(scatters[checks.rank])
        sends = checks.inputs(world * 4096, dtype)
        a2a_in.copy_(sends[checks.rank])
        partials = [p.view(rows, hidden) for p in checks.inputs(rows * hidden, dtype)]
        partial.copy_(partials[checks.rank])
        residual.copy_(checks.inputs(rows * hidden, dtype)[0].view(rows, hidden))
        weight.copy_(checks.inputs(hidden, dtype)[0])
        graph.replay()
        torch.cuda.synchronize()
        for tensor, ranks in zip(tensors, inputs):
            kernel = checks.served("all_reduce", tensor.numel() * 2, dtype, ReduceOp.SUM)
            label = f"graph {algorithm} {replay} all_reduce n={tensor.numel()}"
            checks.expect_reduced(label, tensor, ranks, ReduceOp.SUM, kernel)
        checks.expect_bits(f"graph {algorithm} {replay} all_gather", gather_out, torch.cat(gathers))
        chunks = [t[checks.rank * (1 << 18) : (checks.rank + 1) * (1 << 18)] for t in scatters]
        kernel = checks.served("reduce_scatter_tensor", scatter_in.numel() * 2, dtype, ReduceOp.SUM)
        checks.expect_reduced(
            f"graph {algorithm} {replay} reduce_scatter", scatter_out, chunks, ReduceOp.SUM, kernel
        )
        want = torch.cat([s[checks.rank * 4096 : (checks.rank + 1) * 4096] for s in sends])
        checks.expect_bits(f"graph {algorithm} {replay} all_to_all", a2a_out, want)
        normed, residual_out = fused_reference(partials, residual.cpu(), weight.cpu(), 1e-6)
        checks.expect_bits(f"graph {algorithm} {replay} fused normed", results["fused"][0], normed)
        checks.expect_bits(f"graph {algorithm} {replay} fused residual", results["fused"][1], residual_out)
    del graph
    checks.force(None)


STAGES = ("collectives", "bursts", "side_streams", "async_calls", "all_to_all", "fused", "graphs")


def run_all(checks: Checks, backend, stages: tuple[str, ...] = STAGES) -> dict:
    """Run the named check stages (default: all) and return the world's summary for this rank."""
    run = {
        "collectives": collectives,
        "bursts": bursts,
        "side_streams": side_streams,
        "async_calls": async_calls,
    }
    run.update({"all_to_all": all_to_alls, "fused": fused})
    run["graphs"] = lambda checks: [graphs(checks, backend, algorithm) for algorithm in (None, "zero_copy")]
    for name in stages:
        run[name](checks)
        torch.cuda.synchronize()
        if checks.rank == 0:
            print(f"checks: {name} done, {checks.passed} passed, {len(checks.failures)} failed", flush=True)
    return {"passed": checks.passed, "kernel_served": checks.kernel_served, "failures": checks.failures[:20]}
