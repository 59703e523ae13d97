"""The peer monitor: notices a dead rank within seconds, on every backend.

Two signals travel through the rendezvous store, which every rank already talks to:

* a **death notice**: a rank that is going down with an uncaught exception, SIGTERM or a failed
  op writes ``commlayer/dead/<rank>`` on its way out (noticed by peers within one interval);
* a **heartbeat**: a daemon thread bumps ``commlayer/heartbeat/<rank>`` every interval; a rank
  killed outright (SIGKILL, abort, os._exit) stops beating and is declared dead after
  ``misses`` intervals without a beat.

A store that stops answering means its host (rank 0 under env:// and tcp://) died. Whatever is
noticed goes to :func:`commlayer.health.report`, where the MPI and oneCCL wait loops and the
facade's error translation read it. ``COMMLAYER_HEARTBEAT_INTERVAL`` (seconds, default 0.5;
0 disables the monitor) and ``COMMLAYER_HEARTBEAT_MISSES`` (default 10) tune it.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as torch_dist

from .. import health, settings
from ..fabric_regions import release_regions_of
from ..launch import pid_running

__all__ = [
    "HeartbeatOptions",
    "PeerMonitor",
    "announce_death",
    "request_dumps",
    "start_monitor",
    "stop_monitor",
]

log = logging.getLogger("commlayer.dist")

_HEARTBEAT = "commlayer/heartbeat/{}"
_DEAD = "commlayer/dead/{}"
_DEATHS = "commlayer/deaths"
_DUMP_REQUEST = "commlayer/trace/dump_request"
_PROCESS = "commlayer/process/{}"  # "<host> <pid>": whose /dev/shm regions to remove if it dies
# (host, pid) of peers seen dead, whose shared-memory regions are released once they are gone.
_dead_processes: set[tuple[str, int]] = set()


@dataclass(frozen=True)
class HeartbeatOptions:
    """How often ranks beat, and how many missed beats make a rank dead."""

    interval_s: float = 0.5
    misses: int = 10

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> HeartbeatOptions:
        interval = float(settings.HEARTBEAT_INTERVAL.value(environ))
        misses = int(settings.HEARTBEAT_MISSES.value(environ))
        return cls(interval, max(2, misses))

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0


class PeerMonitor:
    """The daemon thread of one initialised world."""

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        options: HeartbeatOptions,
        on_dump_request: Callable[[str], Any],
    ) -> None:
        self.store = store
        self.on_dump_request = on_dump_request
        self.rank = rank
        self.peers = [peer for peer in range(size) if peer != rank]
        self.options = options
        self._stop = threading.Event()
        self._dumped = False
        now = time.monotonic()
        self._last_beats: dict[int, tuple[int, float]] = {peer: (-1, now) for peer in self.peers}
        self._thread = threading.Thread(target=self._run, name="commlayer-peer-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.options.interval_s + 1)

    def _run(self) -> None:
        beat = 0
        try:
            self.store.set(_PROCESS.format(self.rank), f"{socket.gethostname()} {os.getpid()}")
        except Exception as error:  # noqa: BLE001 - only the /dev/shm cleanup needs it
            log.debug("commlayer: could not publish this process: %s", error)
        while not self._stop.is_set() and health.current() is None:
            beat += 1
            try:
                self.store.add(_HEARTBEAT.format(self.rank), 1)
                self._check_peers()
            except RuntimeError as error:  # DistStoreError / DistNetworkError: the store's host is gone
                if not self._stop.is_set() and self.rank != 0:
                    health.report(0, f"the rendezvous store stopped answering ({error}); its host died")
                return
            self._stop.wait(self.options.interval_s)

    def _check_peers(self) -> None:
        if self.store.add(_DEATHS, 0) > 0:
            for peer in self.peers:
                if self.store.check([_DEAD.format(peer)]):
                    reason = self.store.get(_DEAD.format(peer)).decode(errors="replace")
                    self._declare_dead(peer, reason)
                    return
        self._check_heartbeats()
        if not self._dumped and self.store.check([_DUMP_REQUEST]):
            self._dumped = True
            reason = self.store.get(_DUMP_REQUEST).decode(errors="replace")
            self.on_dump_request(f"asked by a peer: {reason}")

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        limit = self.options.interval_s * self.options.misses
        for peer in self.peers:
            count = self.store.add(_HEARTBEAT.format(peer), 0)
            last_count, since = self._last_beats[peer]
            if count != last_count:
                self._last_beats[peer] = (count, now)
            elif now - since > limit:
                self._declare_dead(
                    peer, f"no heartbeat for {now - since:.1f} s (killed, or hung with the GIL held)"
                )
                return

    def _declare_dead(self, peer: int, reason: str) -> None:
        health.report(peer, reason)
        try:
            host, pid = self.store.get(_PROCESS.format(peer)).decode().split()
        except (RuntimeError, ValueError):  # unknown process: nothing to clean up
            return
        if host == socket.gethostname():
            _dead_processes.add((host, int(pid)))
            release_dead_regions()


_monitor: PeerMonitor | None = None
_world_store: Any = None
_world_rank = -1


def start_monitor(store: Any, rank: int, size: int, on_dump_request: Callable[[str], Any]) -> None:
    """Start watching the peers of a new world (nothing to watch in a world of one).

    The monitor talks to the store over its own connection: a TCPStore client serialises its
    requests, so a main thread blocked in ``store.wait`` would otherwise stop the heartbeats.
    """
    global _monitor, _world_store, _world_rank
    stop_monitor()
    health.clear()
    options = HeartbeatOptions.from_env()
    if size == 1 or not options.enabled:
        return
    _world_store, _world_rank = _own_connection(store, options), rank
    _monitor = PeerMonitor(_world_store, rank, size, options, on_dump_request)
    _monitor.start()
    _install_death_hooks()


def request_dumps(reason: str) -> None:
    """Ask every rank's monitor to dump its flight recorder (after a failure on this rank)."""
    store = _world_store
    if store is not None:
        try:
            store.set(_DUMP_REQUEST, reason)
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


def stop_monitor() -> None:
    global _monitor, _world_store
    monitor, _monitor = _monitor, None
    _world_store = None
    if monitor is not None:
        monitor.stop()
    release_dead_regions(wait_s=1.0)


def release_dead_regions(wait_s: float = 0.0) -> None:
    """Remove the /dev/shm regions of peers seen dead on this host, once their process is gone
    (a SIGTERMed or aborting peer may take a moment to go)."""
    deadline = time.monotonic() + wait_s
    pending = {pid for _, pid in _dead_processes}
    while pending:
        pending = {pid for pid in pending if pid_running(pid)}
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    release_regions_of(pid for _, pid in _dead_processes if pid not in pending)


def announce_death(reason: str) -> None:
    """Tell the peers, through the store, that this rank is going down (best effort, bounded)."""
    store = _world_store
    if store is None:
        return
    try:
        store.set(_DEAD.format(_world_rank), f"rank {_world_rank} {reason}")
        store.add(_DEATHS, 1)
    except Exception as error:  # noqa: BLE001 - the store may be gone too
        log.debug("commlayer: could not announce this rank's death: %s", error)


_hooks_installed = False


def _install_death_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
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
        announce_death(f"raised an uncaught {kind.__name__}: {value}")
        self.previous(kind, value, trace)


def _on_sigterm(signum: int, frame: Any) -> None:
    announce_death("was terminated (SIGTERM)")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
