"""What ordered mode's fused launchers (:mod:`.fast_paths`, :mod:`.native_fast_paths`) need from one MpiBackend.

The backend builds a :class:`LaunchContext` when the facade asks it for a plan and hands it to
the launcher factory, which reads it once per plan; the launchers never see the backend itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from commlayer.core.types import ReduceOp
from commlayer.core.work import WaitLimit, Work

if TYPE_CHECKING:
    from commlayer.backends.mpi.ordered import OrderedExecutor
    from commlayer.backends.mpi.signature import SignatureCheck

__all__ = ["LaunchContext"]


@dataclass(frozen=True)
class LaunchContext:
    """One communicator's state as its launchers use it.

    Args:
        comm: the group's mpi4py communicator.
        mpi: the mpi4py ``MPI`` module (its handle sizes, its exception type).
        size: the group's size.
        rank: this rank's index in ``comm``.
        executor: the ordered executor every blocking call goes through.
        limit: the group's wait limit (its timeout and how a timeout ends the job).
        check: the signature check, None when it is off.
        datatypes: MPI's datatype of each torch dtype.
        reductions: MPI's reduction of each reduce op, by dtype.
        op_method: the backend's method of each op (``op_method(op)``), for the calls the
            launchers hand back to it (CUDA tensors, uneven splits).
    """

    comm: Any
    mpi: ModuleType
    size: int
    rank: int
    executor: OrderedExecutor
    limit: WaitLimit
    check: SignatureCheck | None
    datatypes: Mapping[torch.dtype, Any]
    reductions: Mapping[ReduceOp, Mapping[torch.dtype, Any]]
    op_method: Callable[[str], Callable[..., Work]]
