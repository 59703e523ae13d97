"""Deterministic per-rank inputs and locally computed expectations for the conformance suite.

Every rank can rebuild every other rank's input, so each one computes the exact expected result
of a collective without communicating. Values are chosen so results are exact in every dtype:
small integers where the dtype is narrow (uint8, float16, bfloat16 hold integers up to 240
exactly), and for PRODUCT factors in {1, 1.5, 2} or {1, 2, 3} whose products stay exact.
"""

from __future__ import annotations

from functools import reduce as fold

import torch

from commlayer.core.types import ReduceOp

__all__ = ["DTYPES", "NARROW", "NUMEL", "NUMERIC_DTYPES", "assert_equal", "ops_for", "reduced", "values"]

# Every dtype a backend may declare, in the order the certificate lists them.
NUMERIC_DTYPES = (
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int32,
    torch.int64,
    torch.uint8,
)
DTYPES = (*NUMERIC_DTYPES, torch.bool)
NARROW = (torch.bfloat16, torch.float16, torch.uint8)
NUMEL = 12


def values(
    rank: int, dtype: torch.dtype, op: ReduceOp = ReduceOp.SUM, numel: int = NUMEL, salt: int = 0
) -> torch.Tensor:
    """Rank ``rank``'s input: distinct per (rank, element) wherever the dtype has room."""
    index = torch.arange(numel)
    if dtype is torch.bool:
        return ((rank * 7 + index * 3 + salt) % 5) < 2
    if op is ReduceOp.PRODUCT:
        factors = 1 + (rank + index + salt) % 3
        return (factors * 0.5 + 0.5 if dtype.is_floating_point else factors).to(dtype)
    if dtype in NARROW:
        return ((rank * numel + index + salt) % 60 + 1).to(dtype)
    return (rank * 1000 + index + 1 + salt * 100_000).to(dtype)


def reduced(
    ranks: list[int], dtype: torch.dtype, op: ReduceOp, numel: int = NUMEL, salt: int = 0
) -> torch.Tensor:
    """The result of reducing the inputs of ``ranks`` with ``op``, in ``dtype``'s arithmetic."""
    inputs = [values(rank, dtype, op, numel, salt) for rank in ranks]
    if op is ReduceOp.AVG:
        return fold(torch.add, inputs) / len(ranks)
    return fold(_BINARY[op], inputs)


_BINARY = {
    ReduceOp.SUM: lambda a, b: a | b if a.dtype is torch.bool else a + b,
    ReduceOp.PRODUCT: lambda a, b: a & b if a.dtype is torch.bool else a * b,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
    ReduceOp.BAND: torch.bitwise_and,
    ReduceOp.BOR: torch.bitwise_or,
    ReduceOp.BXOR: torch.bitwise_xor,
}


def ops_for(dtype: torch.dtype) -> list[ReduceOp]:
    """Reduce ops defined for ``dtype`` (bitwise needs integers, AVG needs floating point)."""
    ops = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
    if dtype.is_floating_point:
        return ops + [ReduceOp.AVG]
    return ops + [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]


def assert_equal(actual: torch.Tensor, expected: torch.Tensor, what: str, op: ReduceOp | None = None) -> None:
    """Exact comparison; AVG alone may differ by one ulp where a library averages natively."""
    expected = expected.to(actual.dtype).reshape(actual.shape)
    if op is ReduceOp.AVG:
        torch.testing.assert_close(actual, expected, rtol=torch.finfo(actual.dtype).eps, atol=0, msg=what)
        return
    if not torch.equal(actual, expected):
        raise AssertionError(f"{what}: expected {expected.tolist()}, got {actual.tolist()}")
