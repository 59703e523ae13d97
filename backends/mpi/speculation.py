"""A speculating peer's call, run on scratch memory so that it completes before every rank raises.

The C launcher may enter a collective before every peer has published its signature (see
:mod:`commlayer.contract.mismatch.shared_slots`). A peer that then finds a mismatch cannot just raise: the speculator
would wait inside MPI forever. It runs the speculator's call instead -- decoded from the
speculator's published ``(key, count)`` -- on zeroed buffers of its own, leaving its tensors
untouched, and raises afterwards like every other rank.

Only the calls the C launcher speculates on come here: broadcast (from its root), and the three
two-tensor collectives, whose inputs MPI never writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from commlayer.contract.mismatch.signature import unpack

__all__ = ["scratch_replay"]


def scratch_replay(
    comm: Any,
    from_address: Callable[[int, int], Any],
    datatypes: dict[torch.dtype, Any],
    reductions: dict[Any, Any],
    codes: dict[torch.dtype, int],
) -> Callable[[int, int], None]:
    """``replay(key, count)``: the call a peer published as ``(key, count)``, on scratch memory
    (``from_address(address, bytes)``: mpi4py's buffer over memory it does not own)."""
    dtypes, size = {code: dtype for dtype, code in codes.items()}, comm.Get_size()

    def replay(key: int, count: int) -> None:
        op, dtype_code, reduce_op, root = unpack(key)
        dtype = dtypes[dtype_code]
        kept: list[torch.Tensor] = []  # the scratch tensors live until the call returns

        def scratch(elements: int) -> list[Any]:
            kept.append(torch.zeros(elements, dtype=dtype))
            return [from_address(kept[-1].data_ptr(), kept[-1].nbytes), datatypes[dtype]]

        if op == "broadcast":
            comm.Bcast(scratch(count), root)
        elif op == "all_gather_into_tensor":
            comm.Allgather(scratch(count), scratch(count * size))
        elif op == "reduce_scatter_tensor":
            comm.Reduce_scatter_block(scratch(count * size), scratch(count), reductions[reduce_op][dtype])
        elif op == "all_to_all_single":
            comm.Alltoall(scratch(count), scratch(count))
        else:
            raise RuntimeError(f"mpi: a peer speculated on {op}, which no launcher speculates on")

    return replay
