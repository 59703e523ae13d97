"""Complex tensors as torch runs them: through their real view (``torch.view_as_real``).

torch sends a complex tensor's (real, imaginary) pairs as floats in all_reduce (SUM and AVG only:
MAX, MIN, PRODUCT and the bitwise ops have no complex meaning), broadcast, all_gather(_into_tensor),
scatter, all_to_all(_single) and send/recv; every other op refuses complex dtypes. World of 2::

    t = torch.tensor([1 + 2j]) * (rank + 1)
    dist.all_reduce(t)                      # t == [3 + 6j] on both ranks
    dist.all_reduce(t, op=ReduceOp.MAX)     # ValueError: ... not defined on complex tensors

The ops' validated paths are decorated with :func:`complex_as_real` (a complex dtype never has a
dispatch plan, so the planned common case pays nothing).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from commlayer.core.errors import UnsupportedError, invalid_argument
from commlayer.core.types import ReduceOp
from commlayer.facade.groups.group import current_world

__all__ = ["as_real", "as_real_list", "complex_as_real", "is_complex", "real_for_reduction"]

Op = TypeVar("Op", bound=Callable[..., Any])

_REAL_REDUCTIONS = frozenset({ReduceOp.SUM, ReduceOp.AVG})
# The op torch names in its complex refusal (its coalesced all_reduce reports all_reduce).
_TORCH_OP_NAMES = {"all_reduce_coalesced": "all_reduce"}


def is_complex(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_complex()


def as_real(value: Any) -> Any:
    """The real view of a complex tensor; anything else unchanged (and checked by the op)."""
    return torch.view_as_real(value) if is_complex(value) else value


def as_real_list(values: Any) -> Any:
    return [as_real(value) for value in values] if isinstance(values, (list, tuple)) else values


def real_for_reduction(op_name: str, tensor: torch.Tensor, op: Any) -> torch.Tensor:
    """The real view of ``tensor`` for a reduction, refusing ops undefined on complex numbers."""
    try:
        reduce_op = ReduceOp.coerce(op)
    except ValueError:
        reduce_op = None  # the op's own check names the bad value
    if reduce_op is not None and reduce_op not in _REAL_REDUCTIONS:
        detail = invalid_argument(
            op_name,
            "op",
            f"SUM or AVG for a complex tensor ({tensor.dtype}; other reductions are not defined on "
            "complex tensors, as in torch)",
            reduce_op.name,
            current_world(op_name).rank,
            UnsupportedError,
        )
        # torch's wording first (it names the op torch's way), then the facade's detail.
        raise UnsupportedError(
            f"{_TORCH_OP_NAMES.get(op_name, op_name)} does not support RedOpType.{reduce_op.name} on "
            f"complex tensors. {detail}"
        )
    return torch.view_as_real(tensor)


def complex_as_real(op_name: str, reduction: bool = False) -> Callable[[Op], Op]:
    """Decorate an op so that complex tensor arguments (or lists of them) go as their real views.

    With ``reduction``, the op's ``op`` argument must be SUM or AVG when any tensor is complex.
    """

    def decorate(function: Op) -> Op:
        op_index = list(inspect.signature(function).parameters).index("op") if reduction else -1

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            if not any(map(_holds_complex, args)) and not any(map(_holds_complex, kwargs.values())):
                return function(*args, **kwargs)
            if reduction:
                op = args[op_index] if len(args) > op_index else kwargs.get("op", ReduceOp.SUM)
                tensor = next(value for value in (*args, *kwargs.values()) if is_complex(value))
                real_for_reduction(op_name, tensor, op)
            real_kwargs = {name: as_real_list(as_real(value)) for name, value in kwargs.items()}
            return function(*(as_real_list(as_real(value)) for value in args), **real_kwargs)

        return run  # type: ignore[return-value]

    return decorate


def _holds_complex(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return bool(value) and is_complex(value[0])
    return is_complex(value)
