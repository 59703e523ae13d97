"""Argument checks run before any communication; each error names op, argument, expectation, rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from commlayer.core.errors import InvalidTypeError, UnsupportedError, invalid_argument
from commlayer.core.types import ReduceOp
from commlayer.facade.calls.op_call import OpCall, device_type

__all__ = [
    "check_dtype_match",
    "check_numel",
    "check_output_like",
    "check_peer",
    "check_reduce_op",
    "check_root",
    "check_root_list",
    "check_splits",
    "check_tensor",
    "check_tensor_list",
    "first_device",
    "self_peer",
]


def first_device(value: Any) -> torch.device | None:
    """The device that picks the backend; a type error here is reported by check_tensor later."""
    if isinstance(value, torch.Tensor):
        return value.device
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return value[0].device
    return None


def check_tensor(call: OpCall, arg: str, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        detail = invalid_argument(call.op, arg, "a torch.Tensor", type(value).__name__, call.rank)
        raise InvalidTypeError(
            f"Invalid function argument. Expected parameter `{arg}` of type torch.Tensor\n"
            f"             but got {type(value)} instead. {detail}"
        )
    capabilities = call.backend.capabilities
    if (
        value.dtype in capabilities.dtypes
        and device_type(value.device) in capabilities.devices
        and value.layout is torch.strided
    ):
        return value  # the common case, checked in one line because it runs on every call
    if value.layout is not torch.strided:
        raise invalid_argument(
            call.op, arg, "a dense (strided) tensor", value.layout, call.rank, UnsupportedError
        )
    if value.device.type not in capabilities.devices:
        expected = f"a tensor on {sorted(capabilities.devices)} for backend '{call.backend.name}'"
        raise invalid_argument(call.op, arg, expected, value.device, call.rank, UnsupportedError)
    if value.dtype not in capabilities.dtypes:
        expected = f"a dtype backend '{call.backend.name}' supports ({_names(capabilities.dtypes)})"
        raise invalid_argument(call.op, arg, expected, value.dtype, call.rank, UnsupportedError)
    return value


def check_tensor_list(call: OpCall, arg: str, values: Any, length: int | None) -> list[torch.Tensor]:
    if not isinstance(values, (list, tuple)):
        raise invalid_argument(
            call.op, arg, "a list of tensors", type(values).__name__, call.rank, InvalidTypeError
        )
    if length is not None and len(values) != length:
        raise invalid_argument(
            call.op, arg, f"a list of {length} tensors (the group size)", f"{len(values)} tensors", call.rank
        )
    return [check_tensor(call, f"{arg}[{index}]", value) for index, value in enumerate(values)]


def check_dtype_match(call: OpCall, arg: str, value: torch.Tensor, reference: torch.Tensor) -> None:
    if value.dtype != reference.dtype:
        raise invalid_argument(
            call.op, arg, f"dtype {reference.dtype} (same as the input)", value.dtype, call.rank
        )


def check_numel(
    call: OpCall, arg: str, value: torch.Tensor, expected: int, why: str, *why_args: object
) -> None:
    """``why`` is a ``str.format`` template, filled from ``why_args`` only when the check fails."""
    if value.numel() != expected:
        raise invalid_argument(
            call.op,
            arg,
            f"{expected} elements ({why.format(*why_args)})",
            f"{value.numel()} elements (shape {tuple(value.shape)})",
            call.rank,
        )


def check_output_like(call: OpCall, arg: str, value: Any, reference: torch.Tensor) -> torch.Tensor:
    """An output tensor with ``reference``'s dtype (``reference`` already passed check_tensor)."""
    if (
        isinstance(value, torch.Tensor)
        and value.dtype == reference.dtype
        and value.device == reference.device
        and value.layout is torch.strided
    ):
        return value  # same dtype and device as a checked tensor: nothing else to ask
    check_tensor(call, arg, value)
    check_dtype_match(call, arg, value, reference)
    return value


def check_peer(call: OpCall, arg: str, global_rank: Any, allow_self: bool = True) -> int:
    """Translate a global ``src``/``dst`` into the group rank the backend expects."""
    ranks = call.group.ranks
    if not isinstance(global_rank, int) or isinstance(global_rank, bool) or global_rank not in ranks:
        raise invalid_argument(
            call.op, arg, f"a global rank in the group {list(ranks)}", global_rank, call.rank
        )
    if not allow_self and global_rank == call.rank:
        raise self_peer(call, arg, global_rank)
    return ranks.index(global_rank)


def self_peer(call: OpCall, arg: str, rank: Any) -> Exception:
    """A send or receive naming this process: torch's wording first, then the facade's."""
    side = "source" if arg.endswith("src") else "destination"
    detail = invalid_argument(call.op, arg, "a rank other than this one", rank, call.rank)
    return type(detail)(
        f"Invalid {side} rank: {side} rank should not be the same as the rank of the current process. {detail}"
    )


_SUM = ReduceOp.SUM  # an Enum member read through its class costs a lookup on every call


def check_reduce_op(call: OpCall, op: Any, dtype: torch.dtype) -> ReduceOp:
    if op is _SUM and _SUM in call.backend.capabilities.reduce_ops:
        return op  # SUM is valid for every dtype; skip the general checks on the hot path
    try:
        reduce_op = ReduceOp.coerce(op)
    except ValueError:
        raise invalid_argument(
            call.op, "op", f"a ReduceOp ({', '.join(ReduceOp.__members__)})", op, call.rank
        ) from None
    if reduce_op not in call.backend.capabilities.reduce_ops:
        supported = ", ".join(sorted(o.name for o in call.backend.capabilities.reduce_ops))
        raise invalid_argument(
            call.op,
            "op",
            f"one of backend '{call.backend.name}''s ops ({supported})",
            reduce_op.name,
            call.rank,
            UnsupportedError,
        )
    if reduce_op.is_bitwise and (dtype.is_floating_point or dtype.is_complex):
        raise invalid_argument(
            call.op,
            "op",
            f"an arithmetic op for {dtype} (bitwise ops need integer or bool)",
            reduce_op.name,
            call.rank,
            UnsupportedError,
        )
    if reduce_op is ReduceOp.AVG and not dtype.is_floating_point:
        raise invalid_argument(
            call.op,
            "op",
            f"an op other than AVG for {dtype} (AVG needs a floating dtype)",
            reduce_op.name,
            call.rank,
            UnsupportedError,
        )
    return reduce_op


def _names(dtypes: Sequence[torch.dtype] | frozenset[torch.dtype]) -> str:
    return ", ".join(sorted(str(dtype).replace("torch.", "") for dtype in dtypes))


def check_root(call: OpCall, arg: str, global_rank: int | None, group_rank: int | None) -> int:
    """The root as a group rank, from torch's ``dst=``/``src=`` (global) or ``group_dst=``."""
    if group_rank is not None:
        if global_rank is not None:
            raise invalid_argument(
                call.op, arg, f"either {arg} or group_{arg}, not both", (global_rank, group_rank), call.rank
            )
        if not isinstance(group_rank, int) or not 0 <= group_rank < call.group.size():
            raise invalid_argument(
                call.op, f"group_{arg}", f"a group rank in [0, {call.group.size()})", group_rank, call.rank
            )
        return group_rank
    return check_peer(call, arg, 0 if global_rank is None else global_rank)


def check_root_list(
    call: OpCall, arg: str, values: Any, root: int, reference: torch.Tensor
) -> list[torch.Tensor] | None:
    """gather_list / scatter_list: required on the root, forbidden elsewhere (torch's rule)."""
    if call.group.rank() != root:
        if values:
            raise invalid_argument(
                call.op, arg, "None on a non-root rank", f"a list of {len(values)}", call.rank
            )
        return None
    tensors = check_tensor_list(call, arg, values, call.group.size())
    for index, value in enumerate(tensors):
        check_dtype_match(call, f"{arg}[{index}]", value, reference)
        check_numel(call, f"{arg}[{index}]", value, reference.numel(), "same as the tensor")
    return tensors


def check_splits(
    call: OpCall, arg: str, splits: Sequence[int] | None, tensor: torch.Tensor, size: int
) -> list[int] | None:
    rows = tensor.shape[0] if tensor.dim() else 1  # len(tensor) goes through Python: 4x slower
    if not splits:
        if rows % size:
            raise invalid_argument(
                call.op,
                arg,
                f"given, since dim 0 ({rows}) is not divisible by the group size {size}",
                splits,
                call.rank,
            )
        return None
    splits = list(splits)
    if len(splits) != size:
        expected = f"{size} non-negative ints summing to dim 0 ({rows})"
        detail = invalid_argument(call.op, arg, expected, splits, call.rank)
        raise type(detail)(f"Number of tensor splits not equal to group size. {detail}")
    if any(not isinstance(s, int) or s < 0 for s in splits) or sum(splits) != rows:
        raise invalid_argument(
            call.op, arg, f"{size} non-negative ints summing to dim 0 ({rows})", splits, call.rank
        )
    return splits
