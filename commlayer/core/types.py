"""Value types shared by the facade and every backend: reduce ops, availability, capabilities."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeAlias

import torch

__all__ = [
    "ALL_DTYPES",
    "ALL_OPS",
    "ALL_REDUCE_OPS",
    "DEFAULT_TIMEOUT",
    "Availability",
    "Capabilities",
    "GroupSpec",
    "ReduceOp",
    "Splits",
]

DEFAULT_TIMEOUT = timedelta(minutes=30)

#: all_to_all_single's split sizes: rows sent to (or received from) each rank, in rank order;
#: None (or empty) for equal parts.
Splits: TypeAlias = Sequence[int] | None


class ReduceOp(enum.Enum):
    """Reduction applied by all_reduce, reduce and reduce_scatter.

    Mirrors ``torch.distributed.ReduceOp``; :meth:`coerce` also accepts torch's own values, so code
    written against torch keeps working when it passes ``torch.distributed.ReduceOp.SUM``.
    """

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    # Members are singletons, so identity hashing is exact, and C-level: Enum's default hashes the
    # name in Python, which showed up in the per-call dispatch profile.
    __hash__ = object.__hash__

    @classmethod
    def coerce(cls, op: Any) -> ReduceOp:
        """Return ``op`` as a commlayer ReduceOp; raises ValueError for anything else."""
        if isinstance(op, cls):
            return op
        name = getattr(op, "name", None)
        if isinstance(name, str) and name in cls.__members__:
            return cls[name]
        if isinstance(op, str) and op.upper() in cls.__members__:
            return cls[op.upper()]
        raise ValueError(f"expected a ReduceOp ({', '.join(cls.__members__)}), got {op!r}")

    @property
    def is_bitwise(self) -> bool:
        return self is ReduceOp.BAND or self is ReduceOp.BOR or self is ReduceOp.BXOR


ALL_REDUCE_OPS: frozenset[ReduceOp] = frozenset(ReduceOp)

ALL_DTYPES: frozenset[torch.dtype] = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.bfloat16,
        torch.float16,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    }
)

ALL_OPS: frozenset[str] = frozenset(
    {
        "all_reduce",
        "reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_v",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "reduce_scatter_v",
        "all_to_all",
        "all_to_all_single",
        "gather",
        "scatter",
        "barrier",
        "send",
        "recv",
    }
)


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, and if not, why and how to fix it."""

    available: bool
    reason: str = ""
    install_hint: str = ""

    def __bool__(self) -> bool:
        return self.available

    @classmethod
    def yes(cls) -> Availability:
        return cls(True)

    @classmethod
    def no(cls, reason: str, install_hint: str = "") -> Availability:
        return cls(False, reason, install_hint)


@dataclass(frozen=True)
class Capabilities:
    """What a backend accepts; the facade rejects anything else before communicating."""

    devices: frozenset[str]
    dtypes: frozenset[torch.dtype] = ALL_DTYPES
    reduce_ops: frozenset[ReduceOp] = ALL_REDUCE_OPS
    ops: frozenset[str] = ALL_OPS
    # Receiving from "any source" (torch's recv(src=None)) needs matching support in the library.
    recv_any_source: bool = False
    # Whether send/recv match messages by tag as well as by peer. If not (oneCCL matches by peer
    # alone), the facade refuses a tag other than 0 rather than hand a message to the wrong receive.
    p2p_tags: bool = True
    # Whether the library averages itself. If not, a backend never sees ReduceOp.AVG: the facade
    # runs SUM and divides the result by the group size (AVG still has to be in ``reduce_ops``).
    native_avg: bool = False
    # Whether reduce_scatter_tensor is the library's own. If not (gloo: an all_reduce, then a
    # slice), a caller that can pick either, such as commlayer.ft, all-reduces and slices itself.
    native_reduce_scatter: bool = False


@dataclass(frozen=True)
class GroupSpec:
    """Everything a backend needs to build one communicator.

    ``ranks`` are global ranks in group order: position ``i`` holds the global rank of group rank
    ``i``. For ``new_group([1, 3])`` in a world of 4, global rank 3 gets ``ranks=(1, 3)`` and
    ``group_rank == 1``; global ranks 0 and 2 are not members. ``store`` is the world's rendezvous
    store; a backend namespaces its keys with ``name``, which is unique per group and equal on
    every member. ``members_only`` marks a group that only its members build (torch's
    ``new_group(backend="commlayer")``, which torch asks of the members alone; see
    :meth:`commlayer.contract.backend.Backend.new_group`).
    """

    name: str
    ranks: tuple[int, ...]
    global_rank: int
    store: Any  # torch.distributed.Store
    timeout: timedelta = DEFAULT_TIMEOUT
    options: Any = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    members_only: bool = False

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def is_member(self) -> bool:
        return self.global_rank in self.ranks

    @property
    def group_rank(self) -> int:
        """This process's rank inside the group; -1 when it is not a member."""
        return self.ranks.index(self.global_rank) if self.is_member else -1
