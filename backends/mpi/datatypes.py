"""torch dtypes and ReduceOps as MPI datatypes and MPI ops, resolved once per process.

MPI has no 16-bit float types, so float16 and bfloat16 travel as 2-byte MPI.UINT16_T elements and
reduce through user-defined ops that reinterpret the bytes as the torch dtype and combine with
torch's own arithmetic. Each combine step rounds to the dtype, exactly as torch does for the same
pair of operands, so the results equal a local ``torch.stack(...).sum(0)`` computed pairwise.

bool travels as MPI.UINT8_T holding 0/1, and its ops are the bitwise ones that mean the same on
0/1 bytes (torch's bool SUM is OR, PRODUCT and MIN are AND, MAX is OR). AVG is the facade's: SUM and a
division (see ``Capabilities.native_avg``).

Table, for ``reduction(torch.bfloat16, ReduceOp.MAX)``: datatype UINT16_T, op = user op "bf16 max";
for ``reduction(torch.bool, ReduceOp.SUM)``: datatype UINT8_T, op = MPI.BOR.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from commlayer.core.types import ReduceOp

__all__ = ["SIXTEEN_BIT_FLOATS", "MpiTypes"]

SIXTEEN_BIT_FLOATS = (torch.float16, torch.bfloat16)

_NATIVE_DATATYPE_NAMES = {
    torch.float32: "FLOAT",
    torch.float64: "DOUBLE",
    torch.int8: "INT8_T",
    torch.int16: "INT16_T",
    torch.int32: "INT32_T",
    torch.int64: "INT64_T",
    torch.uint8: "UINT8_T",
    torch.bool: "UINT8_T",
    torch.float16: "UINT16_T",
    torch.bfloat16: "UINT16_T",
}

_NATIVE_OP_NAMES = {
    ReduceOp.SUM: "SUM",
    ReduceOp.PRODUCT: "PROD",
    ReduceOp.MIN: "MIN",
    ReduceOp.MAX: "MAX",
    ReduceOp.BAND: "BAND",
    ReduceOp.BOR: "BOR",
    ReduceOp.BXOR: "BXOR",
}

_BOOL_OP_NAMES = {
    ReduceOp.SUM: "BOR",
    ReduceOp.PRODUCT: "BAND",
    ReduceOp.MIN: "BAND",
    ReduceOp.MAX: "BOR",
    ReduceOp.BAND: "BAND",
    ReduceOp.BOR: "BOR",
    ReduceOp.BXOR: "BXOR",
}

# In-place combiners for the user-defined ops: ``inout = incoming (op) inout``.
_COMBINERS: dict[ReduceOp, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    ReduceOp.SUM: lambda incoming, inout: torch.add(incoming, inout, out=inout),
    ReduceOp.PRODUCT: lambda incoming, inout: torch.mul(incoming, inout, out=inout),
    ReduceOp.MIN: lambda incoming, inout: torch.minimum(incoming, inout, out=inout),
    ReduceOp.MAX: lambda incoming, inout: torch.maximum(incoming, inout, out=inout),
}


@dataclass(frozen=True)
class MpiTypes:
    """The MPI datatype of every dtype and the MPI op of every (ReduceOp, dtype) pair.

    ``reductions[op][dtype]``: nested rather than keyed by a tuple, which saves building and
    hashing a tuple on every call of the hot path.
    """

    datatypes: dict[torch.dtype, Any]
    reductions: dict[ReduceOp, dict[torch.dtype, Any]]

    @classmethod
    def build(cls, mpi: ModuleType) -> MpiTypes:
        datatypes = {dtype: getattr(mpi, name) for dtype, name in _NATIVE_DATATYPE_NAMES.items()}
        reductions: dict[ReduceOp, dict[torch.dtype, Any]] = {op: {} for op in ReduceOp}
        for dtype in datatypes:
            for op in ReduceOp:
                # AVG never reaches a backend that does not declare it native: the facade sums and divides.
                mpi_op = _mpi_op(mpi, dtype, op) if op is not ReduceOp.AVG else None
                if mpi_op is not None:
                    reductions[op][dtype] = mpi_op
        return cls(datatypes, reductions)


def _mpi_op(mpi: ModuleType, dtype: torch.dtype, op: ReduceOp) -> Any | None:
    """The MPI op, or None where the pair is meaningless (the facade rejects those first)."""
    if dtype is torch.bool:
        return getattr(mpi, _BOOL_OP_NAMES[op]) if op in _BOOL_OP_NAMES else None
    if dtype in SIXTEEN_BIT_FLOATS:
        return _user_op(mpi, dtype, op) if op in _COMBINERS else None
    if dtype.is_floating_point and op.is_bitwise:
        return None
    return getattr(mpi, _NATIVE_OP_NAMES[op])


def _user_op(mpi: ModuleType, dtype: torch.dtype, op: ReduceOp) -> Any:
    combine = _COMBINERS[op]

    def reduce_16_bit(incoming: Any, inout: Any, _datatype: Any) -> None:
        # Open MPI also calls it with empty pieces (fewer elements than ranks to spread them over),
        # which torch.frombuffer refuses: an exception here aborts the job.
        if not memoryview(inout).nbytes:
            return
        # Both buffers are mpi4py views of MPI's own memory: reinterpret, never copy.
        combine(torch.frombuffer(incoming, dtype=dtype), torch.frombuffer(inout, dtype=dtype))

    return mpi.Op.Create(reduce_16_bit, commute=True)
