"""The peer monitor's thread: heartbeats, death notices and process checks of one world's peers.

Every interval it bumps this rank's heartbeat and reads the peers' death notices and beats
through the store; between intervals it checks the processes of the peers on this host. A death
it sees goes to :func:`commlayer.core.health.report` (see :mod:`.peer_monitor` for the whole scheme).
The store keys the ranks share are defined here.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from commlayer.core import health, settings
from commlayer.core.processes import gone_reason, pid_running, process_space
from commlayer.core.shm_files import note_local_peers, release_regions_of

__all__ = [
    "CONSEQUENCE_MARK",
    "DEAD_KEY",
    "DEATHS_KEY",
    "DUMP_REQUEST_KEY",
    "HEARTBEAT_KEY",
    "PROCESS_KEY",
    "SEEN_KEY",
    "HeartbeatOptions",
    "PeerMonitor",
    "add_beat_hook",
    "publish_death",
    "release_dead_regions",
]

log = logging.getLogger("commlayer.dist")

HEARTBEAT_KEY = "commlayer/heartbeat/{}"
DEAD_KEY = "commlayer/dead/{}"
DEATHS_KEY = "commlayer/deaths"
DUMP_REQUEST_KEY = "commlayer/trace/dump_request"
SEEN_KEY = "commlayer/failure_seen"  # how many ranks have seen a peer failure
LEFT_KEY = "commlayer/left/{}"  # set by a rank that shut its world down cleanly
PROCESS_KEY = "commlayer/process/{}"  # "<host> <pid>": whose /dev/shm regions to remove if it dies
# A death notice that followed another failure starts with this marker and the cause's rank ("?"
# when the dying rank could not tell who failed first): observers blame the cause, not the notice.
CONSEQUENCE_MARK = "after-peer:"
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
            gone = self._without_departed(self.gone_local_peers())
            if len(gone) == 1:  # alone: it is the one; several: their death notices tell the order
                if self.store_host_lost():
                    self._on_store_lost("no answer after a peer of this host went down")
                else:
                    self._report_local_death(gone[0])
                return
            if now >= next_beat or self._wake.is_set() or gone or self._unknown_processes:
                self._wake.clear()
                try:
                    if now >= next_beat:
                        next_beat = now + self.options.interval_s
                        self.store.add(HEARTBEAT_KEY.format(self.rank), 1)
                    self._learn_processes()
                    if now >= next_beat - self.options.interval_s or gone:
                        self._check_peers()
                except RuntimeError as error:  # DistStoreError / DistNetworkError: the store's host is gone
                    self._on_store_lost(str(error))
                    return
            self._wake.wait(min(_PROCESS_CHECK_S, self.options.interval_s))

    def _on_store_lost(self, why: str) -> None:
        if self._stop.is_set() or self.rank == 0:
            return
        # Rank 0 on this host: the order its process and the others went in tells who was first.
        dead = self.gone_local_peer() if 0 in self.local_pids else None
        if dead is not None:
            self._declare_dead(dead, gone_reason(self.local_pids[dead]))
        else:
            health.report(0, f"the rendezvous store stopped answering ({why}); its host died")

    def store_host_lost(self) -> bool:
        """Whether rank 0, on another host, has stopped answering. It then failed before any peer
        of this host that is gone: a rank 0 going down after another failure keeps the store up
        until every survivor has seen that failure, so a peer of this host that exited since
        went down after rank 0, unable to say so through the store."""
        if self.rank == 0 or 0 in self.local_pids:
            return False
        try:
            self.store.check([HEARTBEAT_KEY.format(self.rank)])
        except RuntimeError:
            return True
        return False

    def wake(self) -> None:
        """Check the peers now rather than at the next interval (a transport saw a peer go)."""
        self._wake.set()

    def learn_processes(self, wait_s: float) -> None:
        """Learn the processes of the peers on this host, waiting (at most ``wait_s``) until every
        peer has published its own: a peer that dies right after init, the store's host included,
        is then found by its process rather than blamed on a survivor that exited after it."""
        keys = [PROCESS_KEY.format(peer) for peer in self._unknown_processes]
        try:
            self.store.wait(keys, timedelta(seconds=wait_s))
        except RuntimeError as error:  # a peer without a monitor: learned later, if ever
            log.debug("commlayer: not every peer published its process: %s", error)
        self._learn_processes()

    def _learn_processes(self) -> None:
        for peer in [
            peer for peer in self._unknown_processes if self.store.check([PROCESS_KEY.format(peer)])
        ]:
            self._unknown_processes.discard(peer)
            host, pid = self.store.get(PROCESS_KEY.format(peer)).decode().split()
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

    def _without_departed(self, gone: list[int]) -> list[int]:
        """``gone`` less the peers that destroyed their world before exiting, which stop being
        watched: a peer may finish the last collective and exit while this rank still completes it."""
        if not gone:
            return gone
        try:
            departed = {peer for peer in gone if self.store.check([LEFT_KEY.format(peer)])}
        except RuntimeError:  # the store's host is gone: the loop's own store call reports it
            return gone
        for peer in departed:
            self._forget_peer(peer)
        return [peer for peer in gone if peer not in departed]

    def _forget_peer(self, peer: int) -> None:
        self.local_pids.pop(peer, None)
        self._gone_since.pop(peer, None)
        self._last_beats.pop(peer, None)
        if peer in self.peers:
            self.peers.remove(peer)

    def gone_local_peer(self, consequences: Collection[int] = ()) -> int | None:
        """The lowest peer on this host whose process is gone without having left the world, and
        did not go down after another failure, if any."""
        gone = self._without_departed(self.gone_local_peers())
        return next((peer for peer in gone if peer not in consequences), None)

    def _check_peers(self) -> None:
        notices = self._death_notices()
        first = next(
            (peer for peer, notice in notices.items() if not notice.startswith(CONSEQUENCE_MARK)), None
        )
        if first is not None:
            self._declare_dead(first, notices[first])
            return
        gone = self.gone_local_peer(consequences=notices)
        if gone is not None:
            self._report_local_death(gone)
            return
        for peer, notice in notices.items():
            cause = notice[len(CONSEQUENCE_MARK) :].split(" ", 1)[0]
            if cause.isdigit() and int(cause) != self.rank:
                self._declare_dead(int(cause), f"named by rank {peer}, which went down after it")
                return
        self._check_heartbeats(consequences=set(notices))
        for hook in tuple(_beat_hooks):
            hook(self.store, self.rank)
        if not self._dumped and self.store.check([DUMP_REQUEST_KEY]):
            self._dumped = True
            reason = self.store.get(DUMP_REQUEST_KEY).decode(errors="replace")
            self.on_dump_request(f"asked by a peer: {reason}")

    def _death_notices(self) -> dict[int, str]:
        if self.store.add(DEATHS_KEY, 0) == 0:
            return {}
        return {
            peer: self.store.get(DEAD_KEY.format(peer)).decode(errors="replace")
            for peer in self.peers
            if self.store.check([DEAD_KEY.format(peer)])
        }

    def _check_heartbeats(self, consequences: set[int]) -> None:
        """Silent peers are dead after ``misses`` intervals; a peer that went down after another
        failure is blamed only once no silent peer can be the cause."""
        now = time.monotonic()
        limit = self.options.interval_s * self.options.misses
        for peer in self.peers:
            count = self.store.add(HEARTBEAT_KEY.format(peer), 0)
            last_count, since = self._last_beats[peer]
            if count != last_count:
                self._last_beats[peer] = (count, now)
            elif now - since > limit and peer not in consequences:
                if self.store.check([LEFT_KEY.format(peer)]):
                    self._forget_peer(peer)
                    return
                self._declare_dead(
                    peer, f"no heartbeat for {now - since:.1f} s (killed, or hung with the GIL held)"
                )
                return
        for peer in sorted(consequences):
            if now - self._last_beats[peer][1] > 2 * limit:
                notice = self.store.get(DEAD_KEY.format(peer)).decode(errors="replace")
                self._declare_dead(peer, notice.split(" ", 1)[-1])
                return

    def _report_local_death(self, peer: int) -> None:
        reason = gone_reason(self.local_pids[peer])
        self._declare_dead(peer, reason)
        publish_death(self.store, peer, reason, self.rank)

    def _declare_dead(self, peer: int, reason: str) -> None:
        health.report(peer, reason)
        try:
            host, pid = self.store.get(PROCESS_KEY.format(peer)).decode().split()
        except (RuntimeError, ValueError):  # unknown process: nothing to clean up
            return
        if host == process_space():
            _dead_processes.add((host, int(pid)))
            release_dead_regions()


# Run by the monitor at every beat with (store, rank): answers to requests of the peers.
_beat_hooks: list[Callable[[Any, int], None]] = []


def add_beat_hook(hook: Callable[[Any, int], None]) -> None:
    """Call ``hook(store, rank)`` from the monitor thread at every beat (it must not block)."""
    if hook not in _beat_hooks:
        _beat_hooks.append(hook)


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


def publish_death(store: Any, peer: int, reason: str, seen_by: int) -> None:
    """Write a death this rank saw (a local peer's process gone) for the ranks on other hosts."""
    try:
        if not store.check([DEAD_KEY.format(peer)]):
            store.set(DEAD_KEY.format(peer), f"rank {peer} {reason} (seen by rank {seen_by})")
            store.add(DEATHS_KEY, 1)
    except Exception as error:  # noqa: BLE001 - the store may be gone too
        log.debug("commlayer: could not publish rank %s's death: %s", peer, error)
