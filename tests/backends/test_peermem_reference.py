"""The host references of peermem's GPU checks: NCCL's rounding bound and the fused norm's math."""

from __future__ import annotations

import torch

from commlayer.backends.peermem.reference import (
    FUSED_THREADS,
    fixed_order_reduce,
    fused_reference,
    rounding_bound,
    within_bound,
)
from commlayer.core.types import ReduceOp


def _inputs(world: int, numel: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=generator).to(dtype) for _ in range(world)]


def _ring(inputs: list[torch.Tensor], start: int) -> torch.Tensor:
    """A ring's reduction as NCCL runs it: from rank ``start`` on, rounded to the dtype each hop."""
    acc = inputs[start].clone()
    for hop in range(1, len(inputs)):
        acc = (acc.float() + inputs[(start + hop) % len(inputs)].float()).to(acc.dtype)
    return acc


def test_nccl_order_of_bf16_sums_passes_the_bound_the_old_tolerance_failed() -> None:
    # The failing benchmark check: reduce_scatter SUM bf16 of 2M elements per rank on 4 GPUs,
    # served by NCCL, "max |diff| 0.0625" on every rank under allclose(rtol=2e-2, atol=1e-2).
    inputs = _inputs(4, 1 << 21, torch.bfloat16)
    reference = fixed_order_reduce(inputs, ReduceOp.SUM)
    for start in range(4):
        got = _ring(inputs, start)
        assert not torch.allclose(got.float(), reference.float(), rtol=2e-2, atol=1e-2)
        assert (got.float() - reference.float()).abs().max().item() == 0.0625
        ok, worst = within_bound(got, inputs, ReduceOp.SUM)
        assert ok and 0.1 < worst <= 1.0


def test_the_bound_still_catches_a_wrong_element() -> None:
    inputs = _inputs(4, 4096, torch.bfloat16, seed=1)
    got = _ring(inputs, 2)
    got[1234] += 0.25
    ok, worst = within_bound(got, inputs, ReduceOp.SUM)
    assert not ok and worst > 1.0
    assert not within_bound(got[:10].clone().fill_(float("nan")), [t[:10] for t in inputs], ReduceOp.SUM)[0]


def test_the_bound_per_op() -> None:
    inputs = _inputs(3, 1000, torch.float16, seed=2)
    assert bool((rounding_bound(inputs, ReduceOp.MAX) == 0).all())
    assert within_bound(fixed_order_reduce(inputs, ReduceOp.MIN), inputs, ReduceOp.MIN)[0]
    scaled = [(t.float() / 3).to(torch.float16) for t in inputs]  # NCCL's AVG: scale first, then sum
    average = scaled[0]
    for t in scaled[1:]:
        average = (average.float() + t.float()).to(torch.float16)
    assert within_bound(average, inputs, ReduceOp.AVG)[0]
    assert within_bound(_ring(inputs, 1), inputs, ReduceOp.SUM)[0]
    assert within_bound(torch.stack(inputs).float().prod(0).to(torch.float16), inputs, ReduceOp.PRODUCT)[0]


def test_fused_reference_adds_the_rank_order_sum_to_the_residual() -> None:
    rows, hidden = 3, 2048
    partials = [t.view(rows, hidden) for t in _inputs(4, rows * hidden, torch.bfloat16, seed=3)]
    residual, weight = (
        _inputs(1, rows * hidden, torch.bfloat16, seed=4)[0].view(rows, hidden),
        torch.ones(hidden),
    )
    normed, residual_out = fused_reference(partials, residual, weight.to(torch.bfloat16), 1e-6)
    summed = fixed_order_reduce(partials, ReduceOp.SUM)
    assert torch.equal(residual_out, (residual.float() + summed.float()).to(torch.bfloat16))
    assert normed.dtype == torch.bfloat16 and normed.shape == (rows, hidden)


def test_fused_reference_is_rms_norm_to_rounding() -> None:
    for rows, hidden, dtype in (
        (4, 4096, torch.bfloat16),
        (2, 8192, torch.bfloat16),
        (5, 1024, torch.float32),
    ):
        partials = [t.view(rows, hidden) for t in _inputs(2, rows * hidden, dtype, seed=hidden)]
        residual = _inputs(1, rows * hidden, dtype, seed=5)[0].view(rows, hidden)
        weight = _inputs(1, hidden, dtype, seed=6)[0]
        normed, residual_out = fused_reference(partials, residual, weight, 1e-5)
        torch_normed = torch.nn.functional.rms_norm(residual_out, (hidden,), weight, 1e-5)
        relative = (normed.float() - torch_normed.float()).abs() / torch_normed.float().abs().clamp_min(1e-30)
        assert relative.max().item() <= 4 * torch.finfo(dtype).eps
        assert (normed == torch_normed).float().mean() > 0.8  # one rounding, as torch


def test_fused_reference_sums_squares_in_the_kernels_order() -> None:
    # float32, one 16-byte unit (4 elements) per thread. Thread 0 holds 2^12 (square 2^24) and
    # zeros, every other thread four 1s. A sequential float32 sum absorbs every 1 into 2^24; the
    # kernel's per-thread sums and butterfly trees add the 1s in fours first and stay exact.
    hidden = 4 * FUSED_THREADS
    values = torch.ones(1, hidden)
    values[0, :4] = torch.tensor([2.0**12, 0.0, 0.0, 0.0])
    zero = torch.zeros(1, hidden)
    normed, _ = fused_reference([values, zero], zero, torch.ones(hidden), 0.0)
    exact = torch.tensor(2.0**24 + 4 * (FUSED_THREADS - 1), dtype=torch.float32)
    assert normed[0, 4].item() == (1 / torch.sqrt(exact / hidden)).item()
    sequential = torch.tensor(2.0**24, dtype=torch.float32)
    assert normed[0, 4].item() != (1 / torch.sqrt(sequential / hidden)).item()
