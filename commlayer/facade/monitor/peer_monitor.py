"""The peer monitor: notices a dead rank within seconds, on every backend.

Two signals travel through the rendezvous store, which every rank already talks to:

* a **death notice**: a rank that is going down with an uncaught exception, SIGTERM or a failed
  op writes ``commlayer/dead/<rank>`` on its way out (noticed by peers within one interval);
* a **heartbeat**: a daemon thread bumps ``commlayer/heartbeat/<rank>`` every interval; a rank
  killed outright (SIGKILL, abort, os._exit) stops beating and is declared dead after
  ``misses`` intervals without a beat;
* a **process check**: every rank publishes its host and pid; a peer on this host whose process
  is gone is declared dead at the next interval, or at once when a transport error makes a
  survivor look (:func:`identify_dead_peer`), and its death is published for the other hosts.

A rank that goes down *because* a peer failed (it saw a connection drop, a peer failure or a
timeout) says so in its notice: such a consequence never hides the rank that failed first.

A store that stops answering means its host (rank 0 under env:// and tcp://) died. Whatever is
noticed goes to :func:`commlayer.core.health.report`, where the MPI and oneCCL wait loops and the
facade's error translation read it. ``COMMLAYERHEARTBEAT_KEY_INTERVAL`` (seconds, default 0.5;
0 disables the monitor) and ``COMMLAYERHEARTBEAT_KEY_MISSES`` (default 10) tune it.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

from commlayer.core import health
from commlayer.core.errors import CommTimeoutError, PeerFailureError
from commlayer.core.processes import gone_reason, process_space
from commlayer.facade.monitor.peer_thread import (
    CONSEQUENCE_MARK,
    DEAD_KEY,
    DEATHS_KEY,
    DUMP_REQUEST_KEY,
    LEFT_KEY,
    PROCESS_KEY,
    SEEN_KEY,
    HeartbeatOptions,
    PeerMonitor,
    publish_death,
    release_dead_regions,
)

__all__ = [
    "announce_death",
    "identify_dead_peer",
    "monitor_store",
    "note_peer_loss",
    "request_dumps",
    "start_monitor",
    "stop_monitor",
]

log = logging.getLogger("commlayer.dist")


def monitor_store() -> tuple[Any, int]:
    """The monitor's own store connection and this rank's number (None, -1 when not monitoring)."""
    return _world_store, _world_rank


_monitor: PeerMonitor | None = None
_world_store: Any = None
_world_rank = -1


def start_monitor(
    store: Any, rank: int, size: int, on_dump_request: Callable[[str], Any], prefix: str = ""
) -> None:
    """Start watching the peers of a new world (nothing to watch in a world of one).

    The monitor talks to the store over its own connection: a TCPStore client serialises its
    requests, so a main thread blocked in ``store.wait`` would otherwise stop the heartbeats.
    """
    global _monitor, _world_store, _world_rank, _saw_peer_loss, _announced
    stop_monitor()
    _saw_peer_loss = _announced = False
    health.clear()
    options = HeartbeatOptions.from_env()
    if size == 1 or not options.enabled:
        return
    _world_store, _world_rank = _own_connection(store, options), rank
    if prefix:  # a shrunk world: its ranks are renumbered, its keys live apart
        _world_store = torch_dist.PrefixStore(prefix, _world_store)
    _publish_process(_world_store, rank)
    _monitor = PeerMonitor(_world_store, rank, size, options, on_dump_request)
    _monitor.learn_processes(wait_s=options.interval_s * options.misses)
    _monitor.start()
    _install_death_hooks()


def _publish_process(store: Any, rank: int) -> None:
    """Before init returns: a peer that sees this rank's connection drop can then check its process."""
    try:
        store.set(PROCESS_KEY.format(rank), f"{process_space()} {os.getpid()}")
    except Exception as error:  # noqa: BLE001 - only the process check and /dev/shm cleanup need it
        log.debug("commlayer: could not publish this process: %s", error)


def request_dumps(reason: str) -> None:
    """Ask every rank's monitor to dump its flight recorder (after a failure on this rank)."""
    store = _world_store
    if store is not None:
        try:
            store.set(DUMP_REQUEST_KEY, reason)
        except Exception as error:  # noqa: BLE001 - the store may be gone with a dead rank 0
            log.debug("commlayer: could not ask the peers to dump: %s", error)


def _own_connection(store: Any, options: HeartbeatOptions) -> Any:
    base = store
    while isinstance(base, torch_dist.PrefixStore):
        base = base.underlying_store
    if not isinstance(base, torch_dist.TCPStore):
        return store  # a FileStore or HashStore: shared, but never blocks for long
    timeout = timedelta(seconds=options.interval_s * options.misses)
    return torch_dist.TCPStore(base.host, base.port, is_master=False, timeout=timeout, wait_for_workers=False)


def stop_monitor(announce: bool = True, departing: bool = False) -> None:
    """Stop watching; ``announce``: a rank leaving after a peer failure says so to the others;
    ``departing``: the world is being destroyed, so a later exit of this process is no death."""
    global _monitor, _world_store
    if announce and _monitor is not None and (_saw_peer_loss or health.current() is not None):
        announce_death("left the job after a peer failed", consequence=True)
    elif departing and _monitor is not None and not _announced:
        _announce_departure(_world_store, _world_rank)
    monitor, _monitor = _monitor, None
    _world_store = None
    if monitor is not None:
        monitor.stop()
    release_dead_regions(wait_s=1.0)


def _announce_departure(store: Any, rank: int) -> None:
    """A clean shutdown: peers still finishing the last collective must not take this rank's
    exit for a death (best effort; without it a peer may report a failure that did not happen)."""
    try:
        store.set(LEFT_KEY.format(rank), "1")
    except Exception as error:  # noqa: BLE001 - the store may already be gone with rank 0
        log.debug("commlayer: could not announce this rank's departure: %s", error)


def announce_death(reason: str, consequence: bool = False) -> None:
    """Tell the peers, through the store, that this rank is going down (best effort, bounded).

    ``consequence``: it goes down because of another failure (a peer's death, a timeout); the
    notice then names the failed peer when this rank knows it, so that observers blame that one.
    """
    global _announced
    store = _world_store
    if store is None or _announced:
        return  # the first notice says why: an exit after an uncaught error adds nothing
    _announced = True
    failure = health.current()
    if consequence or _saw_peer_loss or (failure is not None and failure.rank != _world_rank):
        cause = str(failure.rank) if failure is not None else "?"
        reason = f"{CONSEQUENCE_MARK}{cause} rank {_world_rank} {reason}"
    else:
        reason = f"rank {_world_rank} {reason}"
    try:
        store.set(DEAD_KEY.format(_world_rank), reason)
        store.add(DEATHS_KEY, 1)
        if _world_rank == 0 and failure is not None and failure.rank != 0:
            _keep_store_until_peers_saw(store)
    except Exception as error:  # noqa: BLE001 - the store may be gone too
        log.debug("commlayer: could not announce this rank's death: %s", error)


def _keep_store_until_peers_saw(store: Any) -> None:
    """Rank 0 hosts the store: going down as a consequence, it first waits (bounded) until every
    other survivor has seen the failure. Without the store, a peer that had not yet read the
    death notices would blame rank 0's exit rather than the rank that failed first."""
    monitor = _monitor
    if monitor is None:
        return
    survivors = len(monitor.peers)  # all but the failed rank: this one acknowledged too
    # A peer reads the death notices once per heartbeat interval.
    deadline = time.monotonic() + 2 * monitor.options.interval_s + 0.5
    while store.add(SEEN_KEY, 0) < survivors and time.monotonic() < deadline:
        time.sleep(0.01)


def _acknowledge_failure(failure: health.PeerFailure) -> None:
    """Count this rank among those that saw a failure (see :func:`_keep_store_until_peers_saw`)."""
    store = _world_store
    if store is None or failure.rank == _world_rank:
        return
    try:
        store.add(SEEN_KEY, 1)
    except Exception as error:  # noqa: BLE001 - the store's host may be the failed rank
        log.debug("commlayer: could not acknowledge rank %s's failure: %s", failure.rank, error)


_saw_peer_loss = False
_announced = False


def note_peer_loss() -> None:
    """This rank's transport saw a peer go: if it now goes down, that is a consequence."""
    global _saw_peer_loss
    _saw_peer_loss = True


def identify_dead_peer() -> health.PeerFailure | None:
    """The dead peer, if known now: a report, else a peer on this host whose process is gone.

    Called by a survivor whose transport saw a connection drop; it also wakes the monitor, so a
    death seen only through the store (another host) is read at once rather than at the next beat.
    """
    failure = health.current()
    monitor = _monitor
    if failure is not None or monitor is None:
        return failure
    gone = monitor.gone_local_peers()
    if len(gone) > 1:  # one of them may have gone down after the other: its notice says so
        gone = [peer for peer in gone if not _went_down_after_another(peer)] or gone
    if gone and monitor.store_host_lost():
        monitor.wake()  # the monitor names rank 0, the store's host, once it sees the store gone
        return None
    if gone:
        reason = gone_reason(monitor.local_pids[gone[0]])
        publish_death(_world_store, gone[0], reason, _world_rank)
        return health.report(gone[0], reason)
    monitor.wake()
    return None


def _went_down_after_another(peer: int) -> bool:
    try:
        store = _world_store
        return bool(store.check([DEAD_KEY.format(peer)])) and store.get(DEAD_KEY.format(peer)).decode(
            errors="replace"
        ).startswith(CONSEQUENCE_MARK)
    except Exception:  # noqa: BLE001 - without the store, every gone process counts
        return False


_hooks_installed = False


def _install_death_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    health.add_listener(_acknowledge_failure)
    atexit.register(_announce_unfinished_exit)
    sys.excepthook = _AnnouncingExceptHook(sys.excepthook)
    on_main_thread = threading.current_thread() is threading.main_thread()
    if on_main_thread and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)


def _announce_unfinished_exit() -> None:
    # Still monitoring at exit means destroy_process_group never ran: peers may be waiting on us.
    if _monitor is not None:
        announce_death("exited without calling destroy_process_group")
    stop_monitor()


class _AnnouncingExceptHook:
    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], value: BaseException, trace: Any) -> None:
        consequence = isinstance(value, (PeerFailureError, CommTimeoutError))
        announce_death(f"raised an uncaught {kind.__name__}: {value}", consequence)
        self.previous(kind, value, trace)


def _on_sigterm(signum: int, frame: Any) -> None:
    announce_death("was terminated (SIGTERM)")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
