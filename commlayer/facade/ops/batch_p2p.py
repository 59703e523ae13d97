"""Batched point-to-point: :class:`P2POp` and :func:`batch_isend_irecv`, every entry validated
before any is posted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from commlayer.contract.fallbacks import GenericCollectives
from commlayer.core.boundary import user_facing
from commlayer.core.errors import InvalidArgumentError
from commlayer.core.work import Work
from commlayer.facade.calls.timeouts import CallTimeoutWork, checked_timeout
from commlayer.facade.ops.p2p import PreparedP2P, irecv, isend, prepare_p2p, with_copy_back

__all__ = ["P2POp", "batch_isend_irecv"]


@dataclass(frozen=True)
class P2POp:
    """One entry of :func:`batch_isend_irecv`: ``P2POp(dist.isend, tensor, peer)``."""

    op: Callable[..., Any]
    tensor: torch.Tensor
    peer: int | None = None
    group: Any = None
    tag: int = 0
    group_peer: int | None = None

    def __post_init__(self) -> None:
        if self.op not in (isend, irecv):
            raise InvalidArgumentError(
                f"P2POp: argument 'op' expected commlayer.dist.isend or irecv, received {self.op!r}"
            )


@user_facing
def batch_isend_irecv(
    p2p_op_list: Sequence[P2POp], *, timeout: timedelta | float | None = None
) -> list[Work]:
    """Post every send and receive together and return their works.

    ``timeout`` (a commlayer extension, torchcomms' keyword) gives each Work that deadline: an
    untimed ``wait()`` past it raises CommTimeoutError naming the op, group and rank.

    All entries are validated before anything is posted. Entries on one communicator go to its
    ``batch_p2p`` in a single call, which NCCL needs: two ranks that both send first would
    otherwise deadlock once messages exceed NCCL's eager size.
    """
    if not p2p_op_list or not all(isinstance(p2p, P2POp) for p2p in p2p_op_list):
        raise InvalidArgumentError(
            f"batch_isend_irecv: argument 'p2p_op_list' expected a non-empty list of P2POp, received {p2p_op_list!r}"
        )
    seconds = None if timeout is None else checked_timeout("batch_isend_irecv", timeout)
    prepared = [_prepare_op(p2p) for p2p in p2p_op_list]
    members = [entry for entry in prepared if entry is not None]
    if not members:
        return []
    if seconds is not None:
        works = batch_isend_irecv(p2p_op_list)
        return [
            CallTimeoutWork(work, "batch_isend_irecv", entry.call.group, seconds)
            for work, entry in zip(works, members)
        ]
    backends = {id(entry.call.backend) for entry in members}
    if len(backends) == 1:
        works = members[0].call.backend.batch_p2p([entry.request for entry in members])
    else:
        works = [GenericCollectives.batch_p2p(entry.call.backend, [entry.request])[0] for entry in members]
    return [with_copy_back(work, entry.copy_back) for work, entry in zip(works, members)]


def _prepare_op(p2p: P2POp) -> PreparedP2P | None:
    kind = "send" if p2p.op is isend else "recv"
    if kind == "recv" and p2p.peer is None and p2p.group_peer is None:
        raise InvalidArgumentError(
            "batch_isend_irecv: argument 'peer' expected a rank for every irecv, received None"
        )
    return prepare_p2p(kind, p2p.tensor, p2p.peer, p2p.group, p2p.tag, p2p.group_peer)
