"""Glue between torch tensors and the oneCCL extension: loading it, dtypes, ops and Work.

The extension (``commlayer.backends.ccl._C``, built from csrc/ccl/binding.cpp) takes raw data
pointers, element counts and oneCCL datatypes; this module turns tensors into those and wraps the
returned oneCCL events as :class:`commlayer.work.Work`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch

from commlayer import health
from commlayer.errors import CommTimeoutError
from commlayer.types import ReduceOp
from commlayer.work import Work

__all__ = [
    "CCL_DTYPES",
    "CCL_REDUCE_OPS",
    "CclWork",
    "ExtensionMissing",
    "NativeTypes",
    "buffer",
    "load_extension",
]

EXTENSION = "commlayer.backends.ccl._C"

# torch dtype -> name of the oneCCL datatype (the extension's DataType members).
_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
}
CCL_DTYPES: frozenset[torch.dtype] = frozenset(_DTYPE_NAMES)

# AVG has no oneCCL reduction: it runs as SUM and the result is divided by the group size.
_REDUCTION_NAMES: dict[ReduceOp, str] = {
    ReduceOp.SUM: "sum",
    ReduceOp.AVG: "sum",
    ReduceOp.PRODUCT: "prod",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
}
CCL_REDUCE_OPS: frozenset[ReduceOp] = frozenset(_REDUCTION_NAMES)


class ExtensionMissing(ImportError):
    """The extension was not built or cannot load its libraries."""


def load_extension() -> ModuleType:
    """Import the extension; ExtensionMissing says why it is not there."""
    try:
        return importlib.import_module(EXTENSION)
    except ImportError as error:
        raise ExtensionMissing(f"cannot import {EXTENSION}: {error}") from error


@dataclass(frozen=True)
class NativeTypes:
    """torch dtypes and commlayer reduce ops as the extension's enum members (looked up once)."""

    datatypes: Mapping[torch.dtype, Any]
    reductions: Mapping[ReduceOp, Any]

    @classmethod
    def of(cls, native: ModuleType) -> NativeTypes:
        datatypes = {dtype: getattr(native.DataType, name) for dtype, name in _DTYPE_NAMES.items()}
        reductions = {op: getattr(native.Reduction, name) for op, name in _REDUCTION_NAMES.items()}
        return cls(datatypes, reductions)


def buffer(tensor: torch.Tensor) -> tuple[int, int]:
    """(data pointer, element count) of a contiguous CPU tensor."""
    return tensor.data_ptr(), tensor.numel()


class CclWork(Work):
    """A oneCCL event as a Work.

    ``keep_alive`` holds every tensor oneCCL reads or writes until the op completes, since oneCCL
    only has their raw pointers. A wait without a timeout still ends at the group's timeout: a
    oneCCL op whose peer never calls it would otherwise block forever. Once the group's timeout
    has passed, ``on_expired(message)`` marks the communicator unusable; a shorter wait the
    caller chose leaves the op pending, so it can be waited for again.
    """

    def __init__(
        self,
        event: Any,
        what: tuple[str, str],
        group_timeout: timedelta,
        on_expired: Callable[[str], None],
        result: Sequence[torch.Tensor] = (),
        keep_alive: Sequence[torch.Tensor] = (),
    ) -> None:
        super().__init__(result)
        self._event = event
        self._what = what
        self._group_timeout = group_timeout.total_seconds()
        self._on_expired = on_expired
        self._keep_alive = list(keep_alive)

    def _test(self) -> bool:
        return bool(self._event.test())

    def _block(self, timeout_s: float | None) -> bool:
        limit = self._group_timeout if timeout_s is None else timeout_s
        if self._event.wait_for(max(0.0, limit)):
            return True
        op, where = self._what
        failure = health.current()
        if failure is not None:  # the native wait returned early: the peer monitor saw a death
            self._on_expired(f"peer rank {failure.rank} failed")
            group, rank = _group_and_rank(where)
            raise health.peer_failure_error(op, group, rank, failure)
        message = f"ccl {op} ({where}) did not complete within {limit:g} s"
        if limit < self._group_timeout:
            raise CommTimeoutError(f"{message}; it is still pending and can be waited for again")
        self._on_expired(message)
        raise CommTimeoutError(
            f"{message} (the group timeout); a peer may have failed, or not called the same op in "
            "the same order. This communicator cannot be used any more."
        )

    def _on_complete(self) -> None:
        self._keep_alive = []


def _group_and_rank(where: str) -> tuple[str, int]:
    """``("g", 3)`` from the backend's ``"group 'g', rank 3"``."""
    group, _, rank = where.partition(", rank ")
    return group.removeprefix("group ").strip("'"), int(rank) if rank.isdigit() else -1
