"""Event timing and CUDA-graph capture, shared by the peermem GPU scripts."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as torch_dist


def timed(fn: Callable[[], object], iters: int) -> float:
    """Microseconds per call of ``fn``, ``iters`` calls back to back after a barrier (device events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch_dist.barrier()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def captured(fn: Callable[[], object], calls: int = 1, backend=None, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """A graph of ``calls`` calls of ``fn``, warmed up on a side stream first, as torch asks; with
    a peermem ``backend``, its captured calls then reach their tensors in place."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    if backend is not None:
        backend.register_graph_buffers()
    return graph
