"""The host-side cost, on this machine's CPU, of each piece a planned p2p call adds to ``pg.send``.

A companion of ``p2p_variants.py``: what one clock read, one tensor attribute or the plan-key
lookup costs here (the GPU hosts' CPUs run these 2-3x slower than the project VM's), so that the
variants' differences can be told apart from the pieces they are made of::

    taskset -c 2 python benchmarks/p2p_hostcost.py
"""

from __future__ import annotations

import time
import timeit
import weakref
from collections.abc import Callable
from pathlib import Path

import torch


class Weakly:
    """Any object that takes a weak reference, as commlayer's Work does."""


def cases(tensor: torch.Tensor) -> dict[str, Callable[[], object]]:
    table = {("send", None, 1, 0, tensor.dtype, tensor.device, tensor.layout): 1}
    target = Weakly()
    return {
        "time.monotonic_ns()": time.monotonic_ns,
        "time.perf_counter()": time.perf_counter,
        "tensor.shape": lambda: tensor.shape,
        "tensor.device": lambda: tensor.device,
        "tensor.dtype": lambda: tensor.dtype,
        "tensor.layout": lambda: tensor.layout,
        "tensor.is_contiguous()": tensor.is_contiguous,
        "plan-key lookup": lambda: table.get(
            ("send", None, 1, 0, tensor.dtype, tensor.device, tensor.layout)
        ),
        "weakref.ref(object)": lambda: weakref.ref(target),
        "empty lambda": lambda: None,
    }


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name, call in cases(torch.ones(2, device=device)).items():
        best = min(timeit.repeat(call, number=200_000, repeat=7)) / 200_000 * 1e9
        print(f"{name:28} {best:8.1f} ns ({device})")
    clocksource = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    if clocksource.exists():
        print("clocksource:", clocksource.read_text().strip())


if __name__ == "__main__":
    main()
