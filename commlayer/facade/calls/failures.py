"""Failed ops become typed commlayer errors naming the op, the group and the rank.

A raw library error (gloo's "Connection reset by peer", a torch timeout, an mpi4py exception)
is translated here; a peer failure or timeout also aborts the group and asks every rank to dump
its flight recorder.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from typing import Any, NoReturn

from commlayer.core import call_deadline, health
from commlayer.core.errors import CollectiveMismatchError, CommError, CommTimeoutError, PeerFailureError
from commlayer.core.metrics import format_duration
from commlayer.facade.groups.aborted import abort_group
from commlayer.facade.groups.group import ProcessGroup, resolve_group, world_or_none
from commlayer.facade.monitor.dumps import dump_flight_recorder, dumps_for
from commlayer.facade.monitor.peer_monitor import identify_dead_peer, note_peer_loss, request_dumps
from commlayer.facade.monitor.progress import describe_laggards

__all__ = ["on_failure", "raise_translated", "translate", "typed_wait_error", "wait_translated"]

log = logging.getLogger("commlayer.dist")

# What gloo, torch and MPI libraries say when a peer's process is gone.
_PEER_LOSS = re.compile(
    r"connection (reset|closed|refused)|broken pipe|end of file|peer (closed|disconnected)|"
    r"socket closed|ECONNRESET|EPIPE|read error",
    re.IGNORECASE,
)
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
# What a backend's own error says when it saw a peer process exit (shm: "peer rank 1 (pid 42) exited",
# or "stopped waiting for peer rank 1: ... exited"), or when the peer monitor's report ended its wait.
_PEER_EXITED = re.compile(r"peer rank \d+\b.*exited|peer monitor reported that a rank of the job exited")
# A timeout that already names the rank it waited for (debug mode's check, shm's own wait).
_NAMES_A_RANK = re.compile(r"rank \d+ did not (call|arrive)")
# commlayer errors that already say everything: passed on as they are.
_FINAL_ERRORS = (PeerFailureError, CommTimeoutError, CollectiveMismatchError)
# Longest a survivor waits for the peer monitor to name the rank whose connection dropped.
_IDENTIFY_DEAD_PEER_S = 15.0


def on_failure(group: ProcessGroup, op: str, error: Exception) -> Exception:
    """The error to raise for a failed op, after dumping the flight recorder (a failure in
    communication: an argument the backend refused writes no dump).

    A raw library error (gloo's "Connection reset by peer", a torch timeout, an mpi4py
    exception) becomes a typed commlayer error naming the op, the group and the rank; a peer
    failure or timeout also aborts the group, so that later calls on it fail at once. Other
    ranks are asked (through the store) to dump their recorders too.
    """
    translated = translate(group, op, error)
    if not isinstance(translated, CommError):
        return translated
    # Asking the peers takes up to two heartbeats: worth it after a group timeout, not a short
    # per-call one (the thread has a call deadline), whose caller expects the error at its deadline.
    if (
        isinstance(translated, CommTimeoutError)
        and health.current() is None
        and call_deadline.current() is None
    ):
        translated = _naming_laggards(group, translated)
    if isinstance(translated, (PeerFailureError, CommTimeoutError)):
        abort_group(group, translated)
    group.recorder.mark_failed(op)
    world = world_or_none()
    if world is None or not dumps_for(translated):
        return translated
    reason = f"{op} on group '{group.name}' failed: {type(translated).__name__}: {translated}"
    try:
        dump_flight_recorder(reason=reason)
    except Exception as problem:  # noqa: BLE001 - a failed dump must not hide the op's own error
        log.warning("commlayer: flight recorder dump failed: %s", problem)
    request_dumps(reason)
    return translated


def _naming_laggards(group: ProcessGroup, timeout: CommTimeoutError) -> CommTimeoutError:
    """The timeout, naming the peers that did not call the op, when they can tell."""
    if _NAMES_A_RANK.search(str(timeout)):  # debug mode's check, or the backend, named it already
        return timeout
    laggards = describe_laggards(group)
    if not laggards:
        return timeout
    try:
        named = type(timeout)(f"{timeout}; {laggards}")
    except TypeError:  # a subclass with another constructor
        named = CommTimeoutError(f"{timeout}; {laggards}")
    named.__cause__ = timeout.__cause__
    return named


def raise_translated(group: ProcessGroup, op: str, error: Exception) -> NoReturn:
    """Called from an ``except`` block: re-raise ``error``, or its typed translation."""
    failure = on_failure(group, op, error)
    if failure is error:
        raise error
    raise failure from error


def wait_translated(work: Any, op: str, group_arg: Any, timeout: Any = None) -> None:
    """``work.wait(timeout)`` for a facade op that waits outside ``dispatch.run_op`` (send, recv, barrier),
    with the same error translation, abort and dump as ``dispatch.run_op``."""
    try:
        work.wait(timeout)
    except Exception as error:
        group = resolve_group(op, group_arg)
        if group is None:
            raise
        raise_translated(group, op, error)


def translate(group: ProcessGroup, op: str, error: Exception) -> Exception:
    """A typed, named error for ``error``; commlayer's own errors and bad arguments pass as they are,
    but a backend's CommError that saw a peer exit, or that ended a wait because the peer monitor
    reported a death, becomes a PeerFailureError naming the dead rank."""
    if not isinstance(error, RuntimeError) or isinstance(error, _FINAL_ERRORS):
        return error
    if isinstance(error, CommError) and not _PEER_EXITED.search(str(error)):
        return error
    where = f"{op} on group '{group.name}'"
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    if _PEER_LOSS.search(str(error)) or _PEER_EXITED.search(str(error)) or health.current() is not None:
        note_peer_loss()
        failure = health.current() or _await_failure(group.timeout)
        if failure is not None:
            return health.peer_failure_error(op, group.name, group.global_rank, failure)
        return PeerFailureError(
            f"{where}: a peer closed its connection ({text}) and none has been identified as dead "
            f"yet (rank {group.global_rank})",
            op=op,
            group=group.name,
        )
    if _TIMEOUT.search(str(error)):
        return CommTimeoutError(
            f"{where} did not complete within the group timeout of {format_duration(group.timeout.total_seconds())} (rank "
            f"{group.global_rank}); a peer failed or did not call the same op in the same order: {text}"
        )
    return CommError(
        f"{where} failed in the backend (rank {group.global_rank}): {type(error).__name__}: {text}"
    )


def _await_failure(timeout: timedelta) -> health.PeerFailure | None:
    """Name the peer whose connection dropped: at once when its process (on this host) is gone,
    else once the peer monitor hears of it through the store (bounded)."""
    deadline = time.monotonic() + min(timeout.total_seconds(), _IDENTIFY_DEAD_PEER_S)
    while time.monotonic() < deadline:
        failure = identify_dead_peer()
        if failure is not None:
            return failure
        time.sleep(0.01)
    return health.current()


def typed_wait_error(work: Any, error: Exception) -> Exception:
    """The typed error for a raw one raised by ``work.wait()`` (gloo's "Connection reset by
    peer", a torch timeout): the op and group come from the flight-recorder entry tracking it."""
    world = world_or_none()
    if world is None:
        return error
    for group in (world.default_group, *world.groups.values()):
        op = group.recorder.op_of(work)
        if op is not None:
            return on_failure(group, op, error)
    return translate(world.default_group, "wait", error)
