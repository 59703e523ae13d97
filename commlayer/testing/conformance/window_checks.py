"""Conformance of one-sided windows (``commlayer.window``): every backend, native or emulated.

Layout: member ``j`` of a group of ``n`` owns block ``j`` (``_BLOCK`` elements) of every member's
window; windows differ in size (member ``j``'s holds ``n * _BLOCK + j`` elements) so the checks of
offsets against the *target's* size are exercised.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import commlayer
from commlayer import dist
from commlayer.core.errors import CommTimeoutError, InvalidArgumentError, InvalidTypeError, UnsupportedError
from commlayer.testing.conformance.case import Case

__all__ = ["WINDOW_DTYPES", "block_values", "check_windows", "expect_error"]

WINDOW_DTYPES = (torch.float32, torch.int64, torch.bfloat16)
_BLOCK = 8


def block_values(writer: int, target: int, dtype: torch.dtype) -> torch.Tensor:
    """What global rank ``writer`` puts into global rank ``target``'s window: distinct per pair."""
    return (torch.arange(_BLOCK) + 1 + 16 * writer + 64 * target).to(dtype)


def expect_error(kind: type[Exception], words: tuple[str, ...], action: Callable[[], object]) -> None:
    """``action`` raises ``kind`` whose message holds every one of ``words``."""
    try:
        action()
    except kind as error:
        missing = [word for word in words if word not in str(error)]
        assert not missing, f"{kind.__name__} message lacks {missing}: {error}"
        return
    raise AssertionError(f"expected {kind.__name__} mentioning {words}")


def check_windows(case: Case) -> None:
    """Put, signal, wait_signal, fence, get, map and argument errors, per dtype, sync and async."""
    for dtype in WINDOW_DTYPES:
        case.attempt(
            "window put/signal/get", lambda dtype=dtype: _put_signal_get(case, dtype), dtype, declared=True
        )
    case.attempt("window beside send/recv", lambda: _beside_send_recv(case), declared=True)
    case.attempt("window errors", lambda: _errors(case), declared=True)


def _put_signal_get(case: Case, dtype: torch.dtype) -> None:
    n = len(case.members)
    tensor = torch.full((n * _BLOCK + case.members.index(case.me) if case.is_member else 1,), -1).to(dtype)
    win = commlayer.window(tensor.to(case.device), group=case.group)
    if not case.is_member:
        assert win is None, f"window on a non-member returned {win!r}"
        return
    me, mine = case.group_rank, case.me
    works = [
        win.put(block_values(mine, peer, dtype).to(case.device), peer, me * _BLOCK, async_op=case.async_op)
        for peer in case.members
    ]
    works += [win.signal(peer, async_op=case.async_op) for peer in case.members]
    works += [win.wait_signal(peer, async_op=case.async_op) for peer in case.members]
    for work in works:
        _finish(work, case.async_op)
    for j, writer in enumerate(case.members):  # signals order the puts before them
        _assert_block(
            win.tensor.view(-1)[j * _BLOCK : (j + 1) * _BLOCK], block_values(writer, mine, dtype), "put"
        )
    _finish(win.fence(async_op=case.async_op), case.async_op)
    strided = torch.zeros(2 * _BLOCK, dtype=dtype, device=case.device)[::2]
    for j, writer in enumerate(case.members):
        target = case.members[(me + j) % n]  # every member's window, read from every member
        _finish(win.get(strided, target, j * _BLOCK, async_op=case.async_op), case.async_op)
        _assert_block(strided, block_values(writer, target, dtype), f"get from {target}")
    _check_map(win, case, dtype)
    win.free()


def _beside_send_recv(case: Case) -> None:
    """A window's traffic and the group's own send/recv between the same ranks never meet."""
    n = len(case.members)
    win = commlayer.window(torch.zeros(n * _BLOCK, dtype=torch.int64, device=case.device), group=case.group)
    if not case.is_member or n < 2:
        if win is not None:
            win.free()
        return
    me = case.group_rank
    after, before = case.members[(me + 1) % n], case.members[(me - 1) % n]
    win.put(block_values(case.me, after, torch.int64).to(case.device), after, me * _BLOCK)
    message = (torch.arange(3 * _BLOCK) + 1000 * case.me).to(case.device)  # another size than the put
    sending = dist.isend(message, after, group=case.group)
    win.signal(after)
    received = torch.zeros_like(message)
    dist.recv(received, before, group=case.group)
    sending.wait()
    win.wait_signal(before)
    _assert_block(received, torch.arange(3 * _BLOCK) + 1000 * before, "beside send/recv: the message")
    block = case.members.index(before) * _BLOCK
    _assert_block(
        win.tensor[block : block + _BLOCK],
        block_values(before, case.me, torch.int64),
        "beside send/recv: put",
    )
    win.free()


def _check_map(win: commlayer.Window, case: Case, dtype: torch.dtype) -> None:
    peer = case.members[-1]
    if not win.mappable:
        expect_error(UnsupportedError, ("map", str(case.me)), lambda: win.map(peer))
        return
    view = win.map(peer)
    assert view.numel() == len(case.members) * _BLOCK + len(case.members) - 1, view.numel()
    _assert_block(view[:_BLOCK], block_values(case.members[0], peer, dtype), "map")


def _errors(case: Case) -> None:
    """Bad arguments raise typed errors naming op, argument and rank, before communicating."""
    n = len(case.members)
    win = commlayer.window(torch.zeros(n * _BLOCK, device=case.device), group=case.group)
    if not case.is_member:
        return
    rank, peer = str(case.me), case.members[-1]
    size = torch.zeros(_BLOCK, device=case.device)
    expect_error(
        InvalidTypeError, ("put", "'tensor'", "float32", "int64", rank), lambda: win.put(size.long(), peer)
    )
    expect_error(
        InvalidArgumentError,
        ("put", "'offset'", f"<= {n * _BLOCK}", rank),
        lambda: win.put(size, peer, n * _BLOCK - 1),
    )
    expect_error(InvalidArgumentError, ("get", "'offset'", "-1", rank), lambda: win.get(size, peer, -1))
    outside = max(case.members) + 1
    expect_error(InvalidArgumentError, ("signal", "'dst'", str(outside), rank), lambda: win.signal(outside))
    expect_error(InvalidTypeError, ("get", "'src'", "str", rank), lambda: win.get(size, "0"))  # type: ignore[arg-type]
    silent = case.members[(case.group_rank + 1) % n]
    expect_error(
        CommTimeoutError,
        ("wait_signal", f"rank {silent}", rank),
        lambda: win.wait_signal(silent, timeout=0.2),
    )
    win.signal(case.me)  # a timed-out wait consumed nothing: one signal to oneself satisfies one wait
    win.wait_signal(case.me, timeout=5)
    win.free()
    expect_error(InvalidArgumentError, ("put", "a live window", "freed", rank), lambda: win.put(size, peer))
    expect_error(InvalidArgumentError, ("get", "freed", rank), lambda: win.get(size, peer))


def _finish(work: object, async_op: bool) -> None:
    if async_op:
        assert work is not None and work.wait() is True and work.is_completed(), f"async window op: {work!r}"  # type: ignore[attr-defined]
    else:
        assert work is None, f"a synchronous window op returned {work!r}"


def _assert_block(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if not torch.equal(actual.cpu(), expected):
        raise AssertionError(f"window {what}: expected {expected.tolist()}, got {actual.cpu().tolist()}")
