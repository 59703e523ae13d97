"""The fused tensor-parallel epilogue and the TP block: their math on one process, and a real world.

On CPU the fused op runs its fallback (the backend's all_reduce, then torch's ops); its kernel is
checked on GPUs (benchmarks/gpu/peermem_checks.py) against the host reference tested in
tests/backends/test_peermem_reference.py.
"""

from __future__ import annotations

import torch

from commlayer.parallel import TensorParallelBlock, attention_over_itself
from commlayer.testing import run_world


def test_attention_over_itself_gives_each_head_its_groups_value() -> None:
    q = torch.zeros(2, 4, 3)
    v = torch.arange(2 * 2 * 3, dtype=torch.float32).view(2, 2, 3)
    out = attention_over_itself(q, torch.zeros_like(v), v)
    assert out.shape == (2, 12)
    assert torch.equal(out.view(2, 4, 3)[:, 1], v[:, 0]) and torch.equal(out.view(2, 4, 3)[:, 2], v[:, 1])


def test_a_block_alone_runs_without_a_process_group() -> None:
    block = TensorParallelBlock(32, 48, 4, 2, dtype=torch.float64)
    partial, residual = block(None, torch.randn(3, 32, dtype=torch.float64))
    assert partial.shape == residual.shape == (3, 32)
    assert block.qkv.weight.shape == ((4 + 2 * 2) * 8, 32) and block.down.weight.shape == (32, 48)


def test_in_a_world_of_two() -> None:
    run_world("tests.parallel.tensor_parallel_ranks:main", world_size=2, backend="gloo", timeout=120)
