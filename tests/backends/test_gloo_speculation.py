"""gloo's speculating blocking collectives (backends/gloo_speculation.py): the scratch replay's
identity elements, then real ranks where early ranks enter before the late rank's signature, the
late rank matching (exact results) or not (every rank raises, and the group still pairs its next
call). Rank code: gloo_speculation_ranks.py."""

from __future__ import annotations

import pytest
import torch

from commlayer.backends.gloo_speculation import identity
from commlayer.core.types import ReduceOp
from commlayer.testing import run_world

_REDUCE = {
    ReduceOp.SUM: torch.add,
    ReduceOp.PRODUCT: torch.mul,
    ReduceOp.MIN: torch.minimum,
    ReduceOp.MAX: torch.maximum,
    ReduceOp.BAND: torch.bitwise_and,
    ReduceOp.BOR: torch.bitwise_or,
    ReduceOp.BXOR: torch.bitwise_xor,
}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


_DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.int32, torch.uint8, torch.bool)
_CASES = [
    (reduce_op, dtype)
    for reduce_op in _REDUCE
    for dtype in _DTYPES
    if not (reduce_op in _BITWISE and dtype.is_floating_point)  # bitwise reductions take integers
]


@pytest.mark.parametrize(("reduce_op", "dtype"), _CASES)
def test_the_replay_identity_leaves_every_value_unchanged(reduce_op: ReduceOp, dtype: torch.dtype) -> None:
    values = torch.tensor([0, 1, 5, 100, -7, 127], dtype=torch.int64)
    tensor = (values != 0) if dtype is torch.bool else values.to(dtype)
    if dtype is torch.bool and reduce_op in (ReduceOp.SUM, ReduceOp.PRODUCT):
        reduced = torch.logical_or if reduce_op is ReduceOp.SUM else torch.logical_and
    else:
        reduced = _REDUCE[reduce_op]
    assert torch.equal(reduced(tensor, identity(reduce_op, dtype, tensor.numel())), tensor)


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [2, 3])
def test_speculating_ranks_refuse_a_late_mismatch_and_keep_the_group(world_size: int) -> None:
    run_world("tests.backends.gloo_speculation_ranks:main", world_size, backend="gloo", timeout=180)
