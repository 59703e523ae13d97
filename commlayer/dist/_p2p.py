"""Point-to-point ops, batched p2p and monitored_barrier; peers are global ranks, as in torch."""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch

from ..errors import CommTimeoutError, InvalidArgumentError, invalid_argument
from ..fallbacks import FALLBACK_TAG
from ..work import Work
from . import _validate as check
from ._dispatch import begin, contiguous, launch
from ._groups import resolve_group

__all__ = ["P2POp", "batch_isend_irecv", "irecv", "isend", "monitored_barrier", "recv", "send"]


def isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> Work | None:
    call = begin("send", group, check.first_device("send", "tensor", tensor))
    if call is None:
        return None
    check.check_tensor(call, "tensor", tensor)
    peer = _peer(call, "dst", dst, group_dst)
    source = tensor.contiguous()
    return launch(call, lambda b: b.send(source, peer, tag), async_op=True, payload=tensor)


def irecv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> Work | None:
    call = begin("recv", group, check.first_device("recv", "tensor", tensor))
    if call is None:
        return None
    check.check_tensor(call, "tensor", tensor)
    copy_back: list = []
    buffer = contiguous(tensor, copy_back)
    if src is None and group_src is None:
        if not call.backend.capabilities.recv_any_source:
            raise invalid_argument("recv", "src", f"a rank (backend '{call.backend.name}' cannot receive from any source)", None, call.rank)
        return launch(call, lambda b: b.recv_any(buffer, tag), async_op=True, payload=tensor, copy_back=copy_back)
    peer = _peer(call, "src", src, group_src)
    return launch(call, lambda b: b.recv(buffer, peer, tag), async_op=True, payload=tensor, copy_back=copy_back)


def send(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait(_timeout(group))


def recv(tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor``; returns the sender's global rank (-1 on a non-member)."""
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    work.wait(_timeout(group))
    if src is not None:
        return src
    resolved = resolve_group("recv", group)
    if group_src is not None:
        return resolved.ranks[group_src]
    return resolved.ranks[work.source_rank()]  # type: ignore[attr-defined] - a group rank


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
            raise InvalidArgumentError(f"P2POp: argument 'op' expected commlayer.dist.isend or irecv, received {self.op!r}")


def batch_isend_irecv(p2p_op_list: Sequence[P2POp]) -> list[Work]:
    """Post every send and receive, then return their works (all in flight together)."""
    if not p2p_op_list or not all(isinstance(p2p, P2POp) for p2p in p2p_op_list):
        raise InvalidArgumentError(f"batch_isend_irecv: argument 'p2p_op_list' expected a non-empty list of P2POp, received {p2p_op_list!r}")
    works = []
    for p2p in p2p_op_list:
        peer_kwargs = {"group_dst" if p2p.op is isend else "group_src": p2p.group_peer}
        work = p2p.op(p2p.tensor, p2p.peer, p2p.group, p2p.tag, **peer_kwargs)
        if work is not None:
            works.append(work)
    return works


def monitored_barrier(group: Any = None, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not arrive within ``timeout``.

    Group rank 0 collects a token from every other rank, then releases them; it works on every
    backend because it uses only send and recv.
    """
    call = begin("monitored_barrier", group)
    if call is None:
        return
    deadline = time.monotonic() + (timeout or call.group.timeout).total_seconds()
    token = torch.zeros(1, dtype=torch.int32, device=call.backend.object_device())
    peers = range(1, call.group.size())
    if call.group.rank() != 0:
        call.backend.send(token, 0, FALLBACK_TAG).wait(_remaining(deadline))
        call.backend.recv(token, 0, FALLBACK_TAG).wait(_remaining(deadline))
        return
    tokens = {peer: torch.zeros_like(token) for peer in peers}
    arrivals = {peer: call.backend.recv(tokens[peer], peer, FALLBACK_TAG) for peer in peers}
    missing = _ranks_missing(arrivals, deadline, wait_all_ranks)
    if missing:
        global_missing = [call.group.ranks[peer] for peer in missing]
        raise CommTimeoutError(f"monitored_barrier: ranks {global_missing} did not reach the barrier within {timeout or call.group.timeout} (rank {call.rank})")
    for peer in peers:
        call.backend.send(token, peer, FALLBACK_TAG).wait(_remaining(deadline))


def _ranks_missing(arrivals: dict[int, Work], deadline: float, wait_all_ranks: bool) -> list[int]:
    missing = []
    for peer, work in arrivals.items():
        try:
            work.wait(_remaining(deadline) if not missing else 0.0)
        except CommTimeoutError:
            missing.append(peer)
            if not wait_all_ranks:
                break
    return missing


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _peer(call: Any, arg: str, global_rank: int | None, group_rank: int | None) -> int:
    if group_rank is not None:
        if not isinstance(group_rank, int) or not 0 <= group_rank < call.group.size() or group_rank == call.group.rank():
            raise invalid_argument(call.op, f"group_{arg}", f"another group rank in [0, {call.group.size()})", group_rank, call.rank)
        return group_rank
    return check.check_peer(call, arg, global_rank, allow_self=False)


def _timeout(group: Any) -> timedelta:
    return resolve_group("send/recv", group).timeout
