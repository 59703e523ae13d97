"""gloo's speculating calls (see :mod:`commlayer.contract.mismatch.checks`).

A blocking all_reduce, all_gather_into_tensor, reduce_scatter_tensor, even all_to_all_single or
broadcast (off its root) may enter as soon as the peers that have published agree, and compares
when the call returned (:class:`ConfirmedWork`): by then every peer has published. Waiting for
every signature first would make the ranks enter together, and gloo's round trip, which overlaps
one rank's late arrival with the other's transfer, would then be paid in full on every call.

A rank that finds the mismatch first runs the speculator's call on scratch tensors of its own
(:func:`scratch_replay`) so that gloo sees matching calls and the speculator's call completes;
then every rank raises. Reductions replay with the reduce op's identity, so on two ranks the
speculator's tensor keeps its own values.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.backends.torch_fast_paths import TORCH_OPS, options
from commlayer.contract.mismatch.checks import Replay, Speculation
from commlayer.contract.mismatch.signature import DTYPE_CODES, unpack
from commlayer.core.types import ReduceOp

__all__ = ["SPECULATING_OPS", "ConfirmedWork", "scratch_replay"]

# The ops a blocking call may speculate on: the ones :func:`scratch_replay` can run.
SPECULATING_OPS = frozenset(
    {"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single", "broadcast"}
)
_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
_ZERO_IDENTITY = frozenset({ReduceOp.SUM, ReduceOp.AVG, ReduceOp.BOR, ReduceOp.BXOR})


class ConfirmedWork:
    """torch's Work of a speculated blocking call: waiting for it also confirms the signatures."""

    __slots__ = ("_speculation", "_work")

    def __init__(self, work: Any, speculation: Speculation) -> None:
        self._work, self._speculation = work, speculation

    def wait(self) -> bool:
        """Wait for the call, then raise CollectiveMismatchError if a peer's call differed."""
        self._work.wait()
        self._speculation.confirm()
        return True


def identity(reduce_op: ReduceOp | None, dtype: torch.dtype, count: int) -> torch.Tensor:
    """``count`` elements that leave any value unchanged under ``reduce_op`` (zeros without one)."""
    if reduce_op is None or reduce_op in _ZERO_IDENTITY:
        return torch.zeros(count, dtype=dtype)
    if reduce_op is ReduceOp.PRODUCT:
        return torch.ones(count, dtype=dtype)
    if reduce_op is ReduceOp.BAND:
        return torch.full((count,), True if dtype is torch.bool else -1, dtype=dtype)
    if dtype is torch.bool:
        return torch.full((count,), reduce_op is ReduceOp.MIN, dtype=dtype)
    if dtype.is_floating_point:
        return torch.full((count,), float("inf") if reduce_op is ReduceOp.MIN else -float("inf"), dtype=dtype)
    info = torch.iinfo(dtype)
    return torch.full((count,), info.max if reduce_op is ReduceOp.MIN else info.min, dtype=dtype)


def scratch_replay(process_group: Any, size: int) -> Replay:
    """``replay(key, count)``: the blocking call a peer published as ``(key, count)``, run on
    ``process_group`` with scratch tensors, waited for."""

    def replay(key: int, count: int) -> None:
        op, dtype_code, reduce_op, root = unpack(key)
        dtype = _DTYPES[dtype_code]
        if op == "broadcast":
            work = process_group.broadcast(
                [torch.zeros(count, dtype=dtype)], options(torch_dist.BroadcastOptions, False, rootRank=root)
            )
        elif op == "all_reduce":
            reduction = options(torch_dist.AllreduceOptions, False, reduceOp=TORCH_OPS[reduce_op])
            work = process_group.allreduce([identity(reduce_op, dtype, count)], reduction)
        elif op == "all_gather_into_tensor":
            gathering = options(torch_dist.distributed_c10d.AllgatherOptions, False)
            work = process_group._allgather_base(
                torch.zeros(count * size, dtype=dtype), torch.zeros(count, dtype=dtype), gathering
            )
        elif op == "reduce_scatter_tensor":
            reduction = options(torch_dist.ReduceScatterOptions, False, reduceOp=TORCH_OPS[reduce_op])
            work = process_group._reduce_scatter_base(
                identity(reduce_op, dtype, count), identity(reduce_op, dtype, count * size), reduction
            )
        elif op == "all_to_all_single":
            exchange = options(torch_dist.AllToAllOptions, False)
            work = process_group.alltoall_base(
                torch.zeros(count, dtype=dtype), torch.zeros(count, dtype=dtype), [], [], exchange
            )
        else:
            raise RuntimeError(f"gloo: a peer speculated on {op}, which gloo never speculates on")
        work.wait()

    return replay
