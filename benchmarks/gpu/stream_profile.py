"""Where a training step's GPU time goes: compute, communication, both, neither. Used by the
``--profile`` option of zero.py and parallel_layers.py.

One step runs under ``torch.profiler`` (CUDA activity only); the kernel intervals of its trace are
split into communication kernels (NCCL's and peermem's) and the rest ("compute"), and the step's
span (first kernel start to last kernel end) is divided into: compute running (with or without
communication), communication alone (the compute stream waits on it), and nothing at all (the GPU
waits on the host); the kernel time of each family (NCCL, peermem, attention, GEMM, the rest); and
the CUDA runtime calls the host spent most time in.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

Interval = tuple[float, float]


def _union(intervals: list[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def _intersection(a: list[Interval], b: list[Interval]) -> float:
    """Total overlap of two sorted, disjoint interval lists (a two-pointer sweep)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def split_kernels(trace: dict) -> tuple[list[Interval], list[Interval]]:
    """(compute, communication) kernel intervals in microseconds, from a Chrome trace of the profiler."""
    compute: list[Interval] = []
    comm: list[Interval] = []
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel":
            continue
        interval = (float(event["ts"]), float(event["ts"]) + float(event["dur"]))
        family = _family(event.get("name", "").lower())
        (comm if family in COMMUNICATION else compute).append(interval)
    return _union(compute), _union(comm)


def summarize(compute: list[Interval], comm: list[Interval]) -> dict[str, float]:
    """Milliseconds of the step's span: compute busy, communication alone, idle, and communication
    overlapped."""
    every = _union(compute + comm)
    if not every:
        return {}
    span = every[-1][1] - every[0][0]
    both = _intersection(compute, comm)
    busy_compute, busy_comm = _length(compute), _length(comm)
    return {
        "span_ms": round(span / 1e3, 2),
        "compute_ms": round(busy_compute / 1e3, 2),
        "comm_ms": round(busy_comm / 1e3, 2),
        "comm_overlapped_ms": round(both / 1e3, 2),
        "comm_alone_ms": round((busy_comm - both) / 1e3, 2),
        "idle_ms": round((span - _length(every)) / 1e3, 2),
    }


# Kernel families by name, the first match winning: an attention kernel's name may also carry
# "gemm" or "sm90", a GEMM's rarely "flash". peermem's kernels all take its ``Args`` first.
FAMILIES = (
    ("nccl", ("nccl",)),
    ("peermem", ("(args,",)),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas")),
)
COMMUNICATION = frozenset({"nccl", "peermem"})


def kernel_families(trace: dict, top: int = 8) -> dict[str, Any]:
    """Milliseconds of kernel time per family (nccl, peermem, attention, gemm, other), overlaps counted
    in each: what a step spends on what, to bound what a faster piece could win; and the ``top``
    kernels of "other" by time (names cut to 80 characters)."""
    totals = dict.fromkeys([name for name, _ in FAMILIES] + ["other"], 0.0)
    others: dict[str, float] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") != "kernel":
            continue
        name, ms = event.get("name", ""), float(event["dur"]) / 1e3
        family = _family(name.lower())
        totals[family] += ms
        if family == "other":
            others[name[:80]] = others.get(name[:80], 0.0) + ms
    largest = sorted(others.items(), key=lambda item: -item[1])[:top]
    summary: dict[str, Any] = {family: round(ms, 2) for family, ms in totals.items()}
    summary["top_other"] = [[name, round(ms, 2)] for name, ms in largest]
    return summary


def host_calls(trace: dict, top: int = 14) -> list[list[Any]]:
    """The ``top`` CUDA runtime and driver calls by host milliseconds, with their counts: where the
    host spends the gaps in which the GPU waits on it (a synchronizing call, allocations, launches)."""
    totals: dict[str, list[float]] = {}
    for event in trace.get("traceEvents", []):
        if event.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        entry = totals.setdefault(event.get("name", ""), [0.0, 0])
        entry[0] += float(event.get("dur", 0)) / 1e3
        entry[1] += 1
    largest = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return [[name, round(ms, 2), int(count)] for name, (ms, count) in largest]


def _family(lowered_name: str) -> str:
    return next(
        (family for family, marks in FAMILIES if any(mark in lowered_name for mark in marks)), "other"
    )


def profile_step(step: Callable[[], object]) -> dict[str, Any]:
    """Run ``step`` once under the profiler and summarize its kernels (see the module docstring)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    summary = {**summarize(*split_kernels(trace)), "kernels_ms": kernel_families(trace)}
    return {**summary, "host_calls_ms": host_calls(trace)}
