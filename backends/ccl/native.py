"""Glue between torch tensors and the oneCCL extension: loading it, dtypes, ops and Work.

The extension (``commlayer.backends.ccl._C``, built from csrc/ccl/binding.cpp by setup.py or, on
first use, by ``_build``) takes raw data pointers, element counts and oneCCL datatypes; this module
turns tensors into those and wraps the returned oneCCL events as :class:`commlayer.core.work.Work`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from commlayer.core.types import ReduceOp
from commlayer.core.work import DeadlineWork, WaitLimit

__all__ = [
    "CCL_DTYPES",
    "CCL_REDUCE_OPS",
    "CclWork",
    "ExtensionMissing",
    "NativeTypes",
    "buffer",
    "load_built",
    "load_extension",
    "prebuilt_missing",
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

_REDUCTION_NAMES: dict[ReduceOp, str] = {
    ReduceOp.SUM: "sum",
    ReduceOp.PRODUCT: "prod",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
}
# oneCCL has no AVG; the facade runs it as SUM and divides (the backend does not declare native_avg).
CCL_REDUCE_OPS: frozenset[ReduceOp] = frozenset(_REDUCTION_NAMES) | {ReduceOp.AVG}


class ExtensionMissing(ImportError):
    """The extension was not built or cannot load its libraries."""


def load_extension() -> ModuleType:
    """Import the extension; ExtensionMissing says why it is not there."""
    try:
        return importlib.import_module(EXTENSION)
    except ImportError as error:
        raise ExtensionMissing(f"cannot import {EXTENSION}: {error}") from error


def prebuilt_missing(error: ExtensionMissing) -> bool:
    """Whether ``error`` says no extension was installed at all (not that an installed one is broken)."""
    cause = error.__cause__
    return isinstance(cause, ModuleNotFoundError) and cause.name == EXTENSION


def load_built(path: Path) -> ModuleType:
    """Import the binding compiled at ``path`` (see ``_build``) as the extension module."""
    spec = importlib.util.spec_from_file_location(EXTENSION, path)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as error:
        raise ExtensionMissing(f"cannot load the oneCCL binding built at {path}: {error}") from error
    sys.modules[EXTENSION] = module  # later load_extension() calls find it here
    return module


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


class CclWork(DeadlineWork):
    """A oneCCL event as a Work; oneCCL's wait takes a limit, so no polling is needed.

    When the group's timeout passes, ``on_expired(message)`` marks the communicator unusable.
    """

    def __init__(
        self,
        event: Any,
        op: str,
        limit: WaitLimit,
        on_expired: Callable[[str], None],
        result: Sequence[torch.Tensor] = (),
        keep_alive: Sequence[torch.Tensor] = (),
    ) -> None:
        super().__init__(op, limit, result, keep_alive)
        self._event = event
        self._expired_hook = on_expired

    def _test(self) -> bool:
        return bool(self._event.test())

    def _wait_until(self, limit_s: float) -> bool:
        return bool(self._event.wait_for(limit_s))

    def _on_expired(self, message: str) -> None:
        self._expired_hook(message)
