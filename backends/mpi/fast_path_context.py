"""What ordered mode's fast paths (:mod:`.fast_paths`, :mod:`.native_fast_paths`) need from one MpiBackend.

The backend builds an :class:`MpiFastPathContext` when the facade asks it for a plan and hands it
to the fast-path factory, which reads it once per plan; the fast paths never see the backend itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from commlayer.contract.fast_paths import FastPathContext
from commlayer.core.types import ReduceOp

if TYPE_CHECKING:
    from commlayer.backends.mpi.ordered import OrderedExecutor
    from commlayer.backends.mpi.signature import SignatureCheck

__all__ = ["MpiFastPathContext"]


@dataclass(frozen=True, kw_only=True)
class MpiFastPathContext(FastPathContext):
    """One communicator's state as its fast paths use it (with FastPathContext's size, limit and
    op_method).

    Args:
        comm: the group's mpi4py communicator.
        mpi: the mpi4py ``MPI`` module (its handle sizes, its exception type).
        rank: this rank's index in ``comm``.
        executor: the ordered executor every blocking call goes through.
        check: the signature check, None when it is off.
        datatypes: MPI's datatype of each torch dtype.
        reductions: MPI's reduction of each reduce op, by dtype.
    """

    comm: Any
    mpi: ModuleType
    rank: int
    executor: OrderedExecutor
    check: SignatureCheck | None
    datatypes: Mapping[torch.dtype, Any]
    reductions: Mapping[ReduceOp, Mapping[torch.dtype, Any]]
