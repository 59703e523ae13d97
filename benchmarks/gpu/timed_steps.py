"""The anchors' timing, shared by the GPU benchmark scripts: warm up, reset the peak, time, reduce the peak."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from commlayer import dist


def time_steps(
    step: Callable[[], torch.Tensor], warmup: int, steps: int, device: torch.device
) -> tuple[float, float, torch.Tensor]:
    """Seconds per timed step, the peak GiB allocated on any rank (0 on CPU), and the last loss."""
    on_gpu = device.type == "cuda"
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    for _ in range(warmup):
        step()
    synchronize()
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    dist.barrier()
    start = time.perf_counter()
    loss = torch.zeros(())
    for _ in range(steps):
        loss = step()
    synchronize()
    seconds = (time.perf_counter() - start) / steps
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30 if on_gpu else 0.0], device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return seconds, peak.item(), loss
