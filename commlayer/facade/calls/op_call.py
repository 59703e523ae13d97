"""What a facade call is once resolved: :class:`OpCall`, the device-type memo, and the AVG rule.

AVG is implemented by the facade once: a backend that does not declare ``native_avg`` runs SUM
(:func:`wire_op`) and the facade divides the results by the group size afterwards
(:func:`averaged`, :func:`emulates_avg`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from commlayer.contract.backend import Backend
from commlayer.core.types import ReduceOp
from commlayer.facade.groups.group import ProcessGroup

__all__ = ["OpCall", "averaged", "device_type", "emulates_avg", "wire_op"]

_AVG, SUM = ReduceOp.AVG, ReduceOp.SUM


class OpCall(NamedTuple):
    """One facade call after its group and backend are resolved (a tuple: cheap to build)."""

    op: str
    group: ProcessGroup
    backend: Backend
    device_type: str | None = None  # of the call's tensors ("cpu", "cuda"); None for tensorless ops

    @property
    def rank(self) -> int:
        """Global rank, for error messages."""
        return self.group.global_rank


# torch.device.type builds a new str on every access (about 160 ns, as much as a whole tensor
# check); devices hash in about 20 ns, so each distinct device's type is computed once.
_device_types: dict[torch.device, str] = {}


def device_type(device: torch.device) -> str:
    """``device.type``, memoised."""
    kind = _device_types.get(device)
    if kind is None:
        kind = _device_types[device] = device.type
    return kind


def wire_op(call: OpCall, op: ReduceOp) -> ReduceOp:
    """The reduction the backend runs: SUM for AVG unless it declares ``native_avg``."""
    return SUM if emulates_avg(call, op) else op


def averaged(call: OpCall, op: Any, results: Sequence[torch.Tensor]) -> Sequence[torch.Tensor]:
    """What the facade divides after the op: ``results`` for an AVG the backend runs as SUM.

    AVG is implemented here once: a backend sees it only if it declares ``native_avg``.
    """
    return results if emulates_avg(call, op) else ()


def emulates_avg(call: OpCall, op: Any) -> bool:
    """Whether ``op`` is an AVG the call's backend runs as SUM, leaving the division to the facade."""
    return op is _AVG and not call.backend.capabilities.native_avg
