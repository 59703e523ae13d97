"""Point-to-point ops (isend, irecv, send, recv): planned after their first call of a kind.

Peers are global ranks, as in torch. Batched p2p lives in :mod:`.batch_p2p`, monitored_barrier
in :mod:`.monitored_barrier`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

import torch

from commlayer.contract.fallbacks import P2PRequest
from commlayer.core.boundary import hide_internal_frames
from commlayer.core.errors import CommError, UnsupportedError, invalid_argument
from commlayer.core.work import Work
from commlayer.facade.calls import validate as check
from commlayer.facade.calls.complex_tensors import as_real, is_complex
from commlayer.facade.calls.dispatch import begin, remember, run_op
from commlayer.facade.calls.docstrings import shared_docs
from commlayer.facade.calls.failures import wait_translated
from commlayer.facade.calls.op_call import OpCall
from commlayer.facade.calls.plans import NO_PLAN, native, plans, run_planned, run_staged
from commlayer.facade.calls.staging import contiguous
from commlayer.facade.calls.timeouts import with_timeout
from commlayer.facade.groups.group import resolve_group

__all__ = ["PreparedP2P", "irecv", "isend", "prepare_p2p", "recv", "send", "with_copy_back"]


class PreparedP2P(NamedTuple):
    """A validated send or receive, ready for a backend."""

    call: OpCall
    request: P2PRequest
    copy_back: list


@shared_docs
def isend(
    tensor: torch.Tensor,
    dst: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_dst: int | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Start sending ``tensor`` to rank ``dst`` and return at once.

    Args:
        tensor (Tensor): the data; keep it unchanged until the returned Work completes.
        dst (int): global rank of the receiver.
        {{group}}
        tag (int, optional): matches the receive's tag.
        group_dst (int, optional): ``dst`` given as a rank of ``group`` instead (not both).
        {{timeout}}

    Returns:
        A :class:`~commlayer.core.work.Work` to wait on; None on a rank outside ``group``.

    Raises:
        {{argument errors}}
        {{timeout errors}}
        {{peer failure}}

    Example::

        >>> if dist.get_rank() == 0:
        ...     dist.isend(torch.ones(2), dst=1).wait()
    """
    try:
        if timeout is not None:
            return with_timeout(
                "isend", group, True, timeout, lambda _: isend(tensor, dst, group, tag, group_dst)
            )
        work = _planned_isend(tensor, dst, group, tag, group_dst)
        if work is not NO_PLAN:
            return work
        work = _point_to_point("send", tensor, dst, group, tag, group_dst, True)
        return None if work is NOT_MEMBER else work
    except CommError as error:
        hide_internal_frames(error)
        raise


@shared_docs
def irecv(
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_src: int | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> Work | None:
    """Start receiving into ``tensor`` from rank ``src`` (any rank when None) and return at once.

    Args:
        tensor (Tensor): receives the data once the Work completes.
        src (int, optional): global rank of the sender; None accepts any sender, where the backend
            declares ``recv_any_source``.
        {{group}}
        tag (int, optional): matches the send's tag.
        group_src (int, optional): ``src`` given as a rank of ``group`` instead (not both).
        {{timeout}}

    Returns:
        A :class:`~commlayer.core.work.Work` to wait on (its ``source_rank()`` names the sender of a
        receive from any source); None on a rank outside ``group``.

    Raises:
        {{argument errors}}
        {{timeout errors}}
        {{peer failure}}

    Example::

        >>> if dist.get_rank() == 1:
        ...     incoming = torch.zeros(2)
        ...     dist.irecv(incoming, src=0).wait()
    """
    try:
        if timeout is not None:
            return with_timeout(
                "irecv", group, True, timeout, lambda _: irecv(tensor, src, group, tag, group_src)
            )
        work = _planned_irecv(tensor, src, group, tag, group_src)
        if work is not NO_PLAN:
            return work
        work = _point_to_point("recv", tensor, src, group, tag, group_src, True)
        return None if work is NOT_MEMBER else work
    except CommError as error:
        hide_internal_frames(error)
        raise


@shared_docs
def send(
    tensor: torch.Tensor,
    dst: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_dst: int | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> None:
    """Send ``tensor`` to rank ``dst`` and wait until the send has completed.

    Args:
        tensor (Tensor): the data.
        dst (int): global rank of the receiver.
        {{group}}
        tag (int, optional): matches the receive's tag.
        group_dst (int, optional): ``dst`` given as a rank of ``group`` instead (not both).
        {{timeout}}

    Returns:
        None.

    Raises:
        {{argument errors}}
        {{timeout errors}}
        {{peer failure}}

    Example::

        >>> if dist.get_rank() == 0:
        ...     dist.send(torch.ones(2), dst=1)
    """
    try:
        if timeout is not None:
            with_timeout("send", group, False, timeout, lambda _: isend(tensor, dst, group, tag, group_dst))
            return
        if _planned_send(tensor, dst, group, tag, group_dst) is NO_PLAN:
            _point_to_point("send", tensor, dst, group, tag, group_dst, False)
    except CommError as error:
        hide_internal_frames(error)
        raise


def recv(
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_src: int | None = None,
    *,
    timeout: timedelta | float | None = None,
) -> int:
    """Receive into ``tensor``; returns the sender's global rank (-1 on a non-member).

    ``timeout`` (a commlayer extension, torchcomms' keyword: a timedelta or seconds) bounds this
    call; past it, CommTimeoutError names the op, group and rank. None: the group's timeout.
    """
    try:
        if timeout is not None:
            work = with_timeout(
                "recv", group, True, timeout, lambda _: irecv(tensor, src, group, tag, group_src)
            )
            if work is None:
                return -1
            work.wait()
            return _sender(work, src, group, group_src)
        if src.__class__ is int and group_src is None:  # the common case: its own answer
            if _planned_recv(tensor, src, group, tag, None) is not NO_PLAN:
                return src
            done = _point_to_point("recv", tensor, src, group, tag, None, False)
            return -1 if done is NOT_MEMBER else src
        work = _point_to_point("recv", tensor, src, group, tag, group_src, True)
        if work is NOT_MEMBER:
            return -1
        wait_translated(work, "recv", group)
        return _sender(work, src, group, group_src)
    except CommError as error:
        hide_internal_frames(error)
        raise


def _sender(work: Any, src: int | None, group: Any, group_src: int | None) -> int:
    """The global rank a completed receive came from."""
    resolved = resolve_group("recv", group)
    if src is not None:
        return src
    if group_src is not None:
        return resolved.ranks[group_src]
    return resolved.ranks[work.source_rank()]  # type: ignore[attr-defined] - a group rank


NOT_MEMBER: Any = object()


def _python_planned(kind: str, async_op: bool) -> Callable[..., Any]:
    """The planned call of ``kind`` in Python, where the C one is not built (see PlannedP2P)."""

    def planned(tensor: Any, peer: Any, group: Any, tag: Any, group_peer: Any) -> Any:
        # An int peer only: True and 1.0 equal 1 as keys, and they must still be refused.
        if peer.__class__ is not int or group_peer is not None:
            return NO_PLAN
        return run_planned((kind, group, peer, tag), tensor, async_op)

    return planned


def _planned(kind: str, async_op: bool) -> Callable[..., Any]:
    """``planned(tensor, peer, group, tag, group_peer)``: the call run through its plan, else
    NO_PLAN (no plan yet, or an argument the plan's key cannot vouch for): the C lookup of
    ``commlayer.backends._torch_fast_paths`` where built (~0.2-0.4 us less per call), else Python's."""
    if native is None:
        return _python_planned(kind, async_op)
    return native.PlannedP2P(plans, kind, async_op, NO_PLAN)


_planned_isend = _planned("send", True)
_planned_irecv = _planned("recv", True)
_planned_send = _planned("send", False)
_planned_recv = _planned("recv", False)


def _entry(function: Callable[..., Any], planned: Any, returns_peer: bool = False) -> Callable[..., Any]:
    """``function`` entered in C where built: the C entry runs the plan lookup itself and calls
    ``function`` (which looks up again, then validates) only when that finds no plan, without
    the Python frame that cost isend ~80 ns before the lookup (~0.2 us on the GPU hosts). It
    carries ``function``'s name, docstring and signature."""
    if native is None:
        return function
    return functools.update_wrapper(native.P2PEntry(planned, function, returns_peer), function)


isend = _entry(isend, _planned_isend)
irecv = _entry(irecv, _planned_irecv)
send = _entry(send, _planned_send)
recv = _entry(recv, _planned_recv, returns_peer=True)


def _point_to_point(
    kind: str, tensor: Any, peer: int | None, group: Any, tag: int, group_peer: int | None, async_op: bool
) -> Any:
    """One send or receive: through its plan when one matches, else validated (and planned).

    Returns NOT_MEMBER on a rank outside ``group``, so that a synchronous ``recv`` (which returns
    None when done) can tell the two apart.
    """
    try:
        plan = plans.get((kind, group, peer, tag, tensor.dtype, tensor.device, tensor.layout))
    except (AttributeError, TypeError):  # not a tensor, or an unhashable argument: checked below
        plan = None
    # An int peer only: True and 1.0 equal 1 as keys, and they must still be refused.
    if plan is not None and peer.__class__ is int and group_peer is None and tensor.is_contiguous():
        return plan.run(async_op, tensor)
    if is_complex(tensor):  # torch sends complex tensors as their real view
        return _point_to_point(kind, as_real(tensor), peer, group, tag, group_peer, async_op)
    prepared = prepare_p2p(kind, tensor, peer, group, tag, group_peer)
    if prepared is None:
        return NOT_MEMBER
    request, call = prepared.request, prepared.call
    if request.peer < 0:  # any source: the sender is known only once a message arrives
        work = run_op(
            call, lambda b, hint: b.recv_any(request.tensor, tag, **hint), async_op=True, payload=tensor
        )
        return with_copy_back(work, prepared.copy_back)
    key = (kind, group, peer, tag, tensor.dtype, tensor.device, tensor.layout)
    plan = remember(key, group_peer is None, call, kind, request.peer, tag, dtype=tensor.dtype)
    return run_staged(plan, async_op, prepared.copy_back, request.tensor)


def prepare_p2p(
    kind: str, tensor: Any, peer: int | None, group: Any, tag: int, group_peer: int | None
) -> PreparedP2P | None:
    """One send or receive validated (its peer resolved to a group rank, its tensor staged), or
    None on a rank outside ``group``."""
    call = begin(kind, group, check.first_device(tensor))
    if call is None:
        return None
    check.check_tensor(call, "tensor", tensor)
    if tag != 0 and not call.backend.capabilities.p2p_tags:
        expected = f"0 (backend '{call.backend.name}' matches messages by peer, not by tag)"
        raise invalid_argument(kind, "tag", expected, tag, call.rank, UnsupportedError)
    copy_back: list = []
    buffer = tensor.contiguous() if kind == "send" else contiguous(tensor, copy_back)
    arg = "dst" if kind == "send" else "src"
    if kind == "recv" and peer is None and group_peer is None:
        if not call.backend.capabilities.recv_any_source:
            raise invalid_argument(
                "recv",
                "src",
                f"a rank (backend '{call.backend.name}' cannot receive from any source)",
                None,
                call.rank,
                UnsupportedError,
            )
        return PreparedP2P(call, P2PRequest(kind, buffer, -1, tag), copy_back)
    return PreparedP2P(call, P2PRequest(kind, buffer, _peer(call, arg, peer, group_peer), tag), copy_back)


def _peer(call: Any, arg: str, global_rank: int | None, group_rank: int | None) -> int:
    if group_rank is not None:
        if isinstance(group_rank, int) and group_rank == call.group.rank():
            raise check.self_peer(call, f"group_{arg}", group_rank)
        if not isinstance(group_rank, int) or not 0 <= group_rank < call.group.size():
            raise invalid_argument(
                call.op,
                f"group_{arg}",
                f"another group rank in [0, {call.group.size()})",
                group_rank,
                call.rank,
            )
        return group_rank
    return check.check_peer(call, arg, global_rank, allow_self=False)


def with_copy_back(work: Work, copy_back: list) -> Work:
    """``work``, followed by copying each staged receive buffer into the caller's tensor."""
    if not copy_back:
        return work
    return work.then(lambda: [original.copy_(buffer) for original, buffer in copy_back])
