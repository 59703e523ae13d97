"""torch's ``init_process_group`` onto commlayer on a GPU host: which kernels serve the CUDA calls.

    torchrun --standalone --nproc-per-node 2 benchmarks/gpu/bridge_check.py commlayer
    COMMLAYER_TORCH_TAKEOVER=1 torchrun --standalone --nproc-per-node 2 benchmarks/gpu/bridge_check.py nccl

The group is started with the backend string given (``commlayer``, with ``$COMMLAYER_BACKEND`` to
name commlayer's backends per device, or ``nccl`` under the takeover switch; torch's backend
strings know torch's names only). Checks, each exact where the reduction order is fixed: a
CUDA all_reduce of distinct values (float32 and bfloat16) bitwise equal on every rank and equal to
the host's sum; a CPU all_reduce; DDP and FSDP2 steps against the same steps on a torch NCCL
group of the same ranks (losses within bf16-free float32 rounding); a DTensor redistribute; a
fullgraph ``torch.compile`` of a functional all_reduce; a CUDA-graph capture of ``all_reduce``
replayed with new inputs; two all_reduces on two streams, the first held back on one rank (FSDP2
all-gathers and reduce-scatters on two side streams); an async all_reduce's future, a callback
chained on it, and whether it was complete when handed out. Every CUDA kernel of the all_reduce checks
and of the FSDP2 steps is listed under torch.profiler with its count, and the kernels of NCCL
(``nccl*``) and of peermem (the ``__global__`` names in csrc/peermem) are counted apart, so the
output says which backend served the calls. Rank 0 prints one JSON line.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from datetime import timedelta

import torch
import torch.distributed as torch_dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.profiler import ProfilerActivity, profile


def distinct(rank: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return (torch.arange(numel, dtype=torch.float32) % 97 + 100 * rank).to(dtype).to(device)


def check_all_reduce(rank: int, size: int, device: torch.device, failures: list[str]) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for numel in (7, 4096, 1 << 20):
            got = distinct(rank, numel, dtype, device)
            torch_dist.all_reduce(got)
            want = sum(distinct(r, numel, torch.float32, "cpu") for r in range(size)).to(dtype)
            if not torch.equal(got.cpu(), want):
                failures.append(f"all_reduce {dtype} n={numel} differs from the host sum")
            everyone = [torch.empty_like(got) for _ in range(size)]
            torch_dist.all_gather(everyone, got)
            if any(not torch.equal(other, got) for other in everyone):
                failures.append(f"all_reduce {dtype} n={numel} not bitwise equal across ranks")
    cpu = torch.arange(5, dtype=torch.float64) + rank
    torch_dist.all_reduce(cpu)
    if not torch.equal(cpu, sum(torch.arange(5, dtype=torch.float64) + r for r in range(size))):
        failures.append("cpu all_reduce wrong")


def check_future(rank: int, size: int, device: torch.device, failures: list[str]) -> bool:
    """An async CUDA all_reduce's future and a callback chained on it hold the exact sum; returns
    whether the future was complete when handed out (NCCL's are, and so are peermem's kernels':
    their users wait for the kernel on their own streams, which lets DDP's buckets overlap)."""
    got = distinct(rank, 1 << 20, torch.float32, device)
    future = torch_dist.all_reduce(got, async_op=True).get_future()
    done_at_once = future.done()
    doubled = future.then(lambda settled: settled.value()[0] * 2).wait()
    want = sum(distinct(r, 1 << 20, torch.float32, "cpu") for r in range(size))
    if not (torch.equal(future.wait()[0].cpu(), want) and torch.equal(doubled.cpu(), want * 2)):
        failures.append("an all_reduce's future, or a callback chained on it, holds a wrong sum")
    return done_at_once


def train(model: nn.Module, device: torch.device, rank: int) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(3):
        x = torch.randn(16, 64, generator=generator).to(device)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def fresh_model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)).to(device)


def check_training(
    rank: int, device: torch.device, nccl: torch_dist.ProcessGroup, failures: list[str]
) -> Counter[str]:
    """DDP, FSDP2 and DTensor against the same on ``nccl``; the kernels of the FSDP2 steps."""
    ddp = nn.parallel.DistributedDataParallel
    ours = train(ddp(fresh_model(device), device_ids=[device.index]), device, rank)
    theirs = train(ddp(fresh_model(device), device_ids=[device.index], process_group=nccl), device, rank)
    if not torch.allclose(torch.tensor(ours), torch.tensor(theirs), rtol=1e-5):
        failures.append(f"DDP losses {ours} against NCCL {theirs}")
    size = torch_dist.get_world_size()
    ours_mesh = DeviceMesh.from_group(torch_dist.group.WORLD, "cuda")
    theirs_mesh = DeviceMesh.from_group(nccl, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        ours = train(fully_shard(fresh_model(device), mesh=ours_mesh), device, rank)
        torch.cuda.synchronize()
    theirs = train(fully_shard(fresh_model(device), mesh=theirs_mesh), device, rank)
    if not torch.allclose(torch.tensor(ours), torch.tensor(theirs), rtol=1e-5):
        failures.append(f"FSDP2 losses {ours} against NCCL {theirs}")
    whole = torch.arange(8 * size, dtype=torch.float32, device=device).reshape(size * 2, 4)
    sharded = distribute_tensor(whole, ours_mesh, [Shard(0)])
    if not torch.equal(sharded.redistribute(ours_mesh, [Replicate()]).to_local(), whole):
        failures.append("DTensor redistribute Shard(0) -> Replicate differs")
    return cuda_kernels(trace)


def check_two_streams(rank: int, size: int, device: torch.device, failures: list[str]) -> None:
    """An all_reduce on one stream, held back on rank 0, then one on another stream: each result
    must be its own sum (a group's kernels must run in issue order whatever their streams)."""
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    for round_ in range(3):
        a = distinct(rank + round_, 1 << 16, torch.float32, device)
        b = distinct(rank + 7 * round_, 1 << 18, torch.float32, device)
        first.wait_stream(torch.cuda.current_stream())
        second.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(first):
            if rank == 0:
                torch.cuda._sleep(50_000_000)  # tens of milliseconds: the other call is issued by then
            torch_dist.all_reduce(a)
        with torch.cuda.stream(second):
            torch_dist.all_reduce(b)
        torch.cuda.synchronize()
        want_a = sum(distinct(r + round_, 1 << 16, torch.float32, "cpu") for r in range(size))
        want_b = sum(distinct(r + 7 * round_, 1 << 18, torch.float32, "cpu") for r in range(size))
        if not (torch.equal(a.cpu(), want_a) and torch.equal(b.cpu(), want_b)):
            failures.append(f"all_reduces on two streams differ (round {round_})")


def check_compiled_and_graphed(rank: int, size: int, device: torch.device, failures: list[str]) -> None:
    world = torch_dist.group.WORLD

    def step(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x * 2, "sum", world) + 1

    x = distinct(rank, 1024, torch.float32, device)
    want = sum(2 * distinct(r, 1024, torch.float32, device) for r in range(size)) + 1
    if not torch.equal(torch.compile(step, fullgraph=True, backend="aot_eager")(x), want):
        failures.append("compiled functional all_reduce differs")
    static = distinct(rank, 4096, torch.float32, device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch_dist.all_reduce(static)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch_dist.all_reduce(static)
    for replay in range(3):
        static.copy_(distinct(rank + replay, 4096, torch.float32, device))
        graph.replay()
        want = sum(distinct(r + replay, 4096, torch.float32, "cpu") for r in range(size))
        if not torch.equal(static.cpu(), want):
            failures.append(f"graph replay {replay} differs")


def peermem_kernel_names() -> frozenset[str]:
    """The ``__global__`` functions of csrc/peermem (the sources the kernels are built from)."""
    from commlayer.backends.peermem.kernel_library import SOURCES

    pattern = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(")
    return frozenset(name for path in SOURCES if path.exists() for name in pattern.findall(path.read_text()))


def kernel_name(name: str) -> str:
    """A profiler kernel name without its return type, template arguments and parameters."""
    name = name.removeprefix("void ").strip()
    return re.split(r"[<(]", name, maxsplit=1)[0].strip()


def cuda_kernels(trace: profile) -> Counter[str]:
    """Every CUDA kernel (and copy) of ``trace``, by its whole name, with its count."""
    return Counter(
        event.name for event in trace.events() if event.device_type == torch.autograd.DeviceType.CUDA
    )


def kernel_report(kernels: Counter[str], peermem_names: frozenset[str]) -> dict[str, object]:
    peermem = Counter()
    for name, count in kernels.items():
        if kernel_name(name) in peermem_names:
            peermem[name] += count
    return {
        "peermem": sum(peermem.values()),
        "nccl": sum(count for name, count in kernels.items() if kernel_name(name).lower().startswith("nccl")),
        "peermem_kernels": dict(peermem.most_common()),
        "every_kernel": dict(kernels.most_common()),
    }


def reference_nccl_group(backend: str) -> torch_dist.ProcessGroup:
    """A torch NCCL group of every rank: torch's own also under the takeover switch."""
    try:
        from commlayer.contract.takeover import torch_own
    except ImportError:  # commlayer without the switch
        return torch_dist.new_group(backend="nccl")
    with torch_own():
        return torch_dist.new_group(backend="nccl")


def main() -> None:
    backend = sys.argv[1]
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    # A short timeout: a kernel left waiting for its peer ends as an error, not as a hang.
    torch_dist.init_process_group(backend, timeout=timedelta(seconds=120))
    rank, size = torch_dist.get_rank(), torch_dist.get_world_size()
    world = torch_dist.group.WORLD
    nccl = reference_nccl_group(backend)
    failures: list[str] = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
        check_all_reduce(rank, size, device, failures)
        torch.cuda.synchronize()
    kernels = cuda_kernels(trace)
    future_done_at_once = check_future(rank, size, device, failures)
    fsdp2_kernels = check_training(rank, device, nccl, failures)
    check_compiled_and_graphed(rank, size, device, failures)
    check_two_streams(rank, size, device, failures)
    verdicts = [None] * size
    torch_dist.all_gather_object(verdicts, failures)
    if rank == 0:
        peermem_names = peermem_kernel_names()
        commlayer_group = getattr(world, "commlayer_group", None)
        serving = commlayer_group.backend_for("cuda") if commlayer_group is not None else None
        print(
            json.dumps(
                {
                    "backend_arg": backend,
                    "world": size,
                    "group_type": type(world).__name__,
                    "commlayer_spec": getattr(commlayer_group, "backend_spec", None),
                    "cuda_backend": getattr(serving, "name", None),
                    "peermem_kernel_names": sorted(peermem_names),
                    "all_reduce_kernels": kernel_report(kernels, peermem_names),
                    "future_done_at_once": future_done_at_once,
                    "fsdp2_kernels": kernel_report(fsdp2_kernels, peermem_names),
                    "failures": [f"rank {r}: {f}" for r, fs in enumerate(verdicts) for f in fs],
                }
            ),
            flush=True,
        )
    torch_dist.destroy_process_group()


if __name__ == "__main__":
    main()
