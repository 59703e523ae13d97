"""Loading the shm extension and the codes it takes for dtypes and reduce ops."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch

from commlayer.core.types import ReduceOp

__all__ = ["DTYPE_CODES", "OP_CODES", "load_extension"]

# Must match commlayer::shm::DType and Op in csrc/shm/kernels.hpp.
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.float64: 1,
    torch.bfloat16: 2,
    torch.float16: 3,
    torch.int8: 4,
    torch.uint8: 5,
    torch.int32: 6,
    torch.int64: 7,
    torch.bool: 8,
}
OP_CODES: dict[ReduceOp, int] = {
    ReduceOp.SUM: 0,
    ReduceOp.AVG: 1,
    ReduceOp.PRODUCT: 2,
    ReduceOp.MIN: 3,
    ReduceOp.MAX: 4,
    ReduceOp.BAND: 5,
    ReduceOp.BOR: 6,
    ReduceOp.BXOR: 7,
}


@functools.cache
def load_extension() -> ModuleType:
    """``commlayer.backends.shm._C``; ImportError if the package was installed without building it."""
    return importlib.import_module("commlayer.backends.shm._C")
