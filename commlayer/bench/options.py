"""The settings of one ``commlayer bench`` run, as an immutable value every rank receives."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from commlayer.bench.cases import BENCH_OPS, WINDOW_OPS
from commlayer.core.metrics import size_sweep

__all__ = ["BENCH_DTYPES", "BenchOptions"]

#: ``--dtype`` names; each holds the check values exactly (see commlayer.bench.cases).
BENCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
}


@dataclass(frozen=True)
class BenchOptions:
    backends: tuple[str, ...] = ("gloo",)
    ops: tuple[str, ...] = (
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "all_to_all",
        "barrier",
        "pingpong",
    )
    min_bytes: int = 8
    max_bytes: int = 1 << 30
    step_factor: float = 2.0
    dtype: str = "float32"
    iters: int = 20
    warmup: int = 5
    repeats: int = 1  # timed runs of `iters` per size; the best one is kept
    interleave: bool = False  # backends take turns repeat by repeat at each size
    async_op: bool = False
    check: bool = False
    device: str = "auto"  # "auto": the backend's accelerator when there is one, else cpu
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        unknown = [op for op in self.ops if op not in BENCH_OPS + WINDOW_OPS]
        if unknown or not self.ops:
            raise ValueError(
                f"--ops: expected a comma-separated subset of {','.join(BENCH_OPS + WINDOW_OPS)}, received {','.join(self.ops)!r}"
            )
        if not self.backends or any(not name for name in self.backends):
            raise ValueError(
                f"--backends: expected a comma-separated list of backend names, received {','.join(self.backends)!r}"
            )
        if self.dtype not in BENCH_DTYPES:
            raise ValueError(f"--dtype: expected one of {', '.join(BENCH_DTYPES)}, received {self.dtype!r}")
        if self.iters < 1 or self.warmup < 0:
            raise ValueError(
                f"--iters/--warmup: expected iters >= 1 and warmup >= 0, received {self.iters} and {self.warmup}"
            )
        if self.repeats < 1:
            raise ValueError(f"--repeats: expected an int >= 1, received {self.repeats}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout: expected a positive number of seconds, received {self.timeout_s}")
        size_sweep(self.min_bytes, self.max_bytes, self.step_factor)  # raises on a bad range

    @property
    def torch_dtype(self) -> torch.dtype:
        return BENCH_DTYPES[self.dtype]

    @property
    def sizes(self) -> list[int]:
        return size_sweep(self.min_bytes, self.max_bytes, self.step_factor)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BenchOptions:
        data = json.loads(text)
        data["backends"] = tuple(data["backends"])
        data["ops"] = tuple(data["ops"])
        return cls(**data)
