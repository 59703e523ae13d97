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
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as torch_dist

from .. import health, settings
from ..errors import CommTimeoutError, PeerFailureError
from ..fabric_regions import note_local_peers, release_regions_of
from ..launch import pid_running

__all__ = [
    "HeartbeatOptions",
    "PeerMonitor",
    "add_beat_hook",
    "announce_death",
    "identify_dead_peer",
    "monitor_store",
    "note_peer_loss",
    "publish_death",
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
# A death notice that followed another failure starts with this marker and the cause's rank ("?"
# when the dying rank could not tell who failed first): observers blame the cause, not the notice.
_CONSEQUENCE = "after-peer:"
# How often the processes of peers on this host are checked (a look at /proc, no store traffic).
_PROCESS_CHECK_S = 0.05
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
        self._wake = threading.Event()
        self._dumped = False
        self._host = process_space()
        # Peers on this host whose process can be checked directly: global rank -> pid.
        self.local_pids: dict[int, int] = {}
        self._gone_since: dict[int, float] = {}
        self._unknown_processes = set(self.peers)
        now = time.monotonic()
        self._last_beats: dict[int, tuple[int, float]] = {peer: (-1, now) for peer in self.peers}
        self._thread = threading.Thread(target=self._run, name="commlayer-peer-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.options.interval_s + 1)

    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set() and health.current() is None:
            now = time.monotonic()
            # Between beats only local processes are checked: cheap, and a death is seen at once.
            gone = self.gone_local_peers()
            if len(gone) == 1:  # alone: it is the one; several: their death notices tell the order
                self._declare_dead(gone[0], _process_gone(self.local_pids[gone[0]]))
                publish_death(self.store, gone[0], _process_gone(self.local_pids[gone[0]]), self.rank)
                return
            if now >= next_beat or self._wake.is_set() or gone or self._unknown_processes:
                self._wake.clear()
                try:
                    if now >= next_beat:
                        next_beat = now + self.options.interval_s
                        self.store.add(_HEARTBEAT.format(self.rank), 1)
                    self._learn_processes()
                    if now >= next_beat - self.options.interval_s or gone:
                        self._check_peers()
                except RuntimeError as error:  # DistStoreError / DistNetworkError: the store's host is gone
                    self._on_store_lost(error)
                    return
            self._wake.wait(min(_PROCESS_CHECK_S, self.options.interval_s))

    def _on_store_lost(self, error: RuntimeError) -> None:
        if self._stop.is_set() or self.rank == 0:
            return
        dead = self.gone_local_peer()
        if dead is not None:
            self._declare_dead(dead, _process_gone(self.local_pids[dead]))
        else:
            health.report(0, f"the rendezvous store stopped answering ({error}); its host died")

    def wake(self) -> None:
        """Check the peers now rather than at the next interval (a transport saw a peer go)."""
        self._wake.set()

    def _learn_processes(self) -> None:
        for peer in [peer for peer in self._unknown_processes if self.store.check([_PROCESS.format(peer)])]:
            self._unknown_processes.discard(peer)
            host, pid = self.store.get(_PROCESS.format(peer)).decode().split()
            if host == self._host:
                self.local_pids[peer] = int(pid)
                note_local_peers([int(pid)])

    def gone_local_peers(self) -> list[int]:
        """The peers on this host whose process is gone, in the order this rank saw them go (no
        store involved): checked every few tens of milliseconds, a peer that went down after
        another one's death comes after it."""
        now = time.monotonic()
        for peer, pid in list(self.local_pids.items()):
            if peer not in self._gone_since and not pid_running(pid):
                self._gone_since.setdefault(peer, now)
        return sorted(self._gone_since, key=lambda peer: (self._gone_since[peer], peer))

    def gone_local_peer(self, consequences: Collection[int] = ()) -> int | None:
        """The lowest peer on this host whose process is gone and did not go down after another
        failure, if any."""
        return next((peer for peer in self.gone_local_peers() if peer not in consequences), None)

    def _check_peers(self) -> None:
        notices = self._death_notices()
        first = next((peer for peer, notice in notices.items() if not notice.startswith(_CONSEQUENCE)), None)
        if first is not None:
            self._declare_dead(first, notices[first])
            return
        gone = self.gone_local_peer(consequences=notices)
        if gone is not None:
            self._declare_dead(gone, _process_gone(self.local_pids[gone]))
            publish_death(self.store, gone, _process_gone(self.local_pids[gone]), self.rank)
            return
        for peer, notice in notices.items():
            cause = notice[len(_CONSEQUENCE) :].split(" ", 1)[0]
            if cause.isdigit() and int(cause) != self.rank:
                self._declare_dead(int(cause), f"named by rank {peer}, which went down after it")
                return
        self._check_heartbeats(consequences=set(notices))
        for hook in tuple(_beat_hooks):
            hook(self.store, self.rank)
        if not self._dumped and self.store.check([_DUMP_REQUEST]):
            self._dumped = True
            reason = self.store.get(_DUMP_REQUEST).decode(errors="replace")
            self.on_dump_request(f"asked by a peer: {reason}")

    def _death_notices(self) -> dict[int, str]:
        if self.store.add(_DEATHS, 0) == 0:
            return {}
        return {
            peer: self.store.get(_DEAD.format(peer)).decode(errors="replace")
            for peer in self.peers
            if self.store.check([_DEAD.format(peer)])
        }

    def _check_heartbeats(self, consequences: set[int]) -> None:
        """Silent peers are dead after ``misses`` intervals; a peer that went down after another
        failure is blamed only once no silent peer can be the cause."""
        now = time.monotonic()
        limit = self.options.interval_s * self.options.misses
        for peer in self.peers:
            count = self.store.add(_HEARTBEAT.format(peer), 0)
            last_count, since = self._last_beats[peer]
            if count != last_count:
                self._last_beats[peer] = (count, now)
            elif now - since > limit and peer not in consequences:
                self._declare_dead(
                    peer, f"no heartbeat for {now - since:.1f} s (killed, or hung with the GIL held)"
                )
                return
        for peer in sorted(consequences):
            if now - self._last_beats[peer][1] > 2 * limit:
                notice = self.store.get(_DEAD.format(peer)).decode(errors="replace")
                self._declare_dead(peer, notice.split(" ", 1)[-1])
                return

    def _declare_dead(self, peer: int, reason: str) -> None:
        health.report(peer, reason)
        try:
            host, pid = self.store.get(_PROCESS.format(peer)).decode().split()
        except (RuntimeError, ValueError):  # unknown process: nothing to clean up
            return
        if host == process_space():
            _dead_processes.add((host, int(pid)))
            release_dead_regions()


def process_space() -> str:
    """Where this process's pid means something: host name, boot and pid namespace. Ranks in one
    space can check each other's processes; network-namespace "hosts" on one machine may share a
    host name but not their pids."""
    parts = [socket.gethostname()]
    for read in (
        lambda: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        lambda: os.readlink("/proc/self/ns/pid"),
    ):
        try:
            parts.append(read())
        except OSError:
            parts.append("?")
    return "/".join(part.replace(" ", "_") for part in parts)


# Run by the monitor at every beat with (store, rank): answers to requests of the peers.
_beat_hooks: list[Callable[[Any, int], None]] = []


def add_beat_hook(hook: Callable[[Any, int], None]) -> None:
    """Call ``hook(store, rank)`` from the monitor thread at every beat (it must not block)."""
    if hook not in _beat_hooks:
        _beat_hooks.append(hook)


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
    _monitor.start()
    _install_death_hooks()


def _publish_process(store: Any, rank: int) -> None:
    """Before init returns: a peer that sees this rank's connection drop can then check its process."""
    try:
        store.set(_PROCESS.format(rank), f"{process_space()} {os.getpid()}")
    except Exception as error:  # noqa: BLE001 - only the process check and /dev/shm cleanup need it
        log.debug("commlayer: could not publish this process: %s", error)


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


def stop_monitor(announce: bool = True) -> None:
    """Stop watching; ``announce``: a rank leaving after a peer failure says so to the others."""
    global _monitor, _world_store
    if announce and _monitor is not None and (_saw_peer_loss or health.current() is not None):
        announce_death("left the job after a peer failed", consequence=True)
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
        reason = f"{_CONSEQUENCE}{cause} rank {_world_rank} {reason}"
    else:
        reason = f"rank {_world_rank} {reason}"
    try:
        store.set(_DEAD.format(_world_rank), reason)
        store.add(_DEATHS, 1)
    except Exception as error:  # noqa: BLE001 - the store may be gone too
        log.debug("commlayer: could not announce this rank's death: %s", error)


def publish_death(store: Any, peer: int, reason: str, seen_by: int) -> None:
    """Write a death this rank saw (a local peer's process gone) for the ranks on other hosts."""
    try:
        if not store.check([_DEAD.format(peer)]):
            store.set(_DEAD.format(peer), f"rank {peer} {reason} (seen by rank {seen_by})")
            store.add(_DEATHS, 1)
    except Exception as error:  # noqa: BLE001 - the store may be gone too
        log.debug("commlayer: could not publish rank %s's death: %s", peer, error)


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
    if gone:
        reason = _process_gone(monitor.local_pids[gone[0]])
        publish_death(_world_store, gone[0], reason, _world_rank)
        return health.report(gone[0], reason)
    monitor.wake()
    return None


def _went_down_after_another(peer: int) -> bool:
    try:
        store = _world_store
        return bool(store.check([_DEAD.format(peer)])) and store.get(_DEAD.format(peer)).decode(
            errors="replace"
        ).startswith(_CONSEQUENCE)
    except Exception:  # noqa: BLE001 - without the store, every gone process counts
        return False


def _process_gone(pid: int) -> str:
    return f"its process (pid {pid}) is gone: it exited, was killed or crashed"


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
        consequence = isinstance(value, (PeerFailureError, CommTimeoutError))
        announce_death(f"raised an uncaught {kind.__name__}: {value}", consequence)
        self.previous(kind, value, trace)


def _on_sigterm(signum: int, frame: Any) -> None:
    announce_death("was terminated (SIGTERM)")
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
