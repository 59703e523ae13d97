"""One pass of the conformance suite (a group and a mode) and how each cell's verdict is taken.

A combination the backend does not declare (``Capabilities``) must raise UnsupportedError before
communicating; it is then "declared unsupported".
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from commlayer.contract.backend import Backend
from commlayer.core.errors import UnsupportedError
from commlayer.core.types import ReduceOp
from commlayer.testing.conformance.certificate import FAIL, PASS, UNSUPPORTED, Cell, Certificate
from commlayer.testing.conformance.values import NUMEL, values

__all__ = ["Case", "dtype_name"]

#: Object helpers pickle into uint8 tensors, so they need the backend to carry uint8.
_OBJECT_DTYPE = torch.uint8
#: Facade ops that are not backend ops, and the backend ops they are built from.
_BUILT_FROM = {"batch_isend_irecv": ("send", "recv"), "monitored_barrier": ("send", "recv")}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class Case:
    """One pass of the suite: a group, a mode, the backend under test and where verdicts go."""

    group: Any  # None (WORLD) or a ProcessGroup / NON_GROUP_MEMBER
    members: list[int]  # global ranks, in group order
    me: int  # global rank
    async_op: bool
    device: torch.device
    backend: Backend
    certificate: Certificate

    @property
    def is_member(self) -> bool:
        return self.me in self.members

    @property
    def group_rank(self) -> int:
        return self.members.index(self.me)

    @property
    def label(self) -> str:
        return f"group={self.members} async={self.async_op}"

    def run(self, launch: Callable[[bool], Any]) -> None:
        """Launch with this case's async_op, check the handle, and wait for it."""
        work = launch(self.async_op)
        if not self.is_member or not self.async_op:
            assert work is None, f"{self.label}: expected None, got {work!r}"
            return
        assert work.wait() is True and work.is_completed(), f"{self.label}: work not completed"

    def tensor(
        self, rank: int, dtype: torch.dtype, op: ReduceOp = ReduceOp.SUM, numel: int = NUMEL, salt: int = 0
    ) -> torch.Tensor:
        return values(rank, dtype, op, numel, salt).to(self.device)

    def attempt(
        self,
        name: str,
        body: Callable[[], None],
        dtype: torch.dtype | None = None,
        reduce_op: ReduceOp | None = None,
        declared: bool | None = None,
    ) -> None:
        """Run one cell's launches and checks and record its verdict.

        ``name`` starts with the facade op(s) the cell needs ("send/recv non-contiguous"); whether
        the backend declares the cell follows from them, ``dtype`` and ``reduce_op``, unless
        ``declared`` says so for ops that are not backend ops (object helpers, getters).
        """
        cell = Cell(
            name,
            reduce_op.name if reduce_op is not None else "",
            dtype_name(dtype) if dtype is not None else "",
            "world" if self.group is None else "subgroup",
            "async" if self.async_op else "sync",
        )
        if self._declares(name, dtype, reduce_op, declared):
            self._record(cell, *_outcome(body))
        elif self.is_member:  # a non-member returns before validating anything
            self._record(cell, *_rejection(body))

    def declares_objects(self) -> bool:
        return _OBJECT_DTYPE in self.backend.capabilities.dtypes

    def _declares(
        self, name: str, dtype: torch.dtype | None, reduce_op: ReduceOp | None, declared: bool | None
    ) -> bool:
        capabilities = self.backend.capabilities
        first = name.split()[0]
        ops = _BUILT_FROM.get(first, first.split("/"))
        return (
            (all(op in capabilities.ops for op in ops) if declared is None else declared)
            and (dtype is None or dtype in capabilities.dtypes)
            and (reduce_op is None or reduce_op in capabilities.reduce_ops)
        )

    def _record(self, cell: Cell, status: str, detail: str) -> None:
        self.certificate.record(cell, status, self.me, detail)


def _outcome(body: Callable[[], None]) -> tuple[str, str]:
    try:
        body()
    except Exception as error:  # noqa: BLE001 - a failing cell is recorded; the suite goes on
        return FAIL, _describe(error)
    return PASS, ""


def _rejection(body: Callable[[], None]) -> tuple[str, str]:
    try:
        body()
    except UnsupportedError:
        return UNSUPPORTED, ""
    except Exception as error:  # noqa: BLE001 - recorded as the wrong rejection
        return FAIL, f"expected UnsupportedError for an undeclared combination, got {_describe(error)}"
    return FAIL, "ran although the backend does not declare it (expected UnsupportedError)"


def _describe(error: BaseException) -> str:
    where = traceback.extract_tb(error.__traceback__)[-1:]
    line = f" [{Path(where[0].filename).name}:{where[0].lineno}]" if where else ""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}{line}"
