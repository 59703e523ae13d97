"""The peer monitor's view of its peers' processes.

A rank may finish the last collective and exit while a peer is still completing it; the monitor
must not abort that peer's call with a failure that did not happen. A peer that dies right
after init must already be known by its process, or a survivor blames whichever peer it sees go.
And when rank 0's host goes, a peer of this host that exits after it is not the one to blame.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import torch.distributed as torch_dist

from commlayer.core import health
from commlayer.core.processes import process_space
from commlayer.facade.monitor.peer_thread import LEFT_KEY, PROCESS_KEY, HeartbeatOptions, PeerMonitor


def _exited_process() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _failure_seen(monitor: PeerMonitor) -> health.PeerFailure | None:
    """What ``monitor`` reports in half a second of watching (many of its intervals)."""
    health.clear()
    monitor.start()
    time.sleep(0.5)
    monitor.stop()
    failure = health.current()
    health.clear()
    return failure


def _watch_an_exited_peer(departed: bool) -> health.PeerFailure | None:
    store = torch_dist.HashStore()
    store.set(PROCESS_KEY.format(1), f"{process_space()} {_exited_process()}")
    if departed:
        store.set(LEFT_KEY.format(1), "1")
    return _failure_seen(
        PeerMonitor(store, 0, 2, HeartbeatOptions(0.05, 4), on_dump_request=lambda reason: None)
    )


def test_a_peer_that_destroyed_its_world_and_exited_is_not_a_failure() -> None:
    assert _watch_an_exited_peer(departed=True) is None


def test_a_peer_that_exited_without_leaving_is_named_dead() -> None:
    failure = _watch_an_exited_peer(departed=False)
    assert failure is not None and failure.rank == 1, failure


def test_the_monitor_learns_a_peer_published_after_it_started_waiting() -> None:
    store = torch_dist.HashStore()
    monitor = PeerMonitor(store, 0, 3, HeartbeatOptions(0.05, 4), on_dump_request=lambda reason: None)
    store.set(PROCESS_KEY.format(1), f"{process_space()} 101")
    late = threading.Timer(0.2, lambda: store.set(PROCESS_KEY.format(2), f"{process_space()} 102"))
    late.start()
    monitor.learn_processes(wait_s=5.0)
    late.join()
    assert monitor.local_pids == {1: 101, 2: 102}


def test_a_peer_that_never_publishes_delays_the_monitor_only_boundedly() -> None:
    store = torch_dist.HashStore()
    monitor = PeerMonitor(store, 0, 3, HeartbeatOptions(0.05, 4), on_dump_request=lambda reason: None)
    store.set(PROCESS_KEY.format(2), "another-host 7")
    started = time.monotonic()
    monitor.learn_processes(wait_s=0.2)
    assert time.monotonic() - started < 2.0
    assert monitor.local_pids == {}


class _StoreOfAHost:
    """A store whose host can go: every call raises, as a TCPStore client's do, once it has."""

    def __init__(self) -> None:
        self.store, self.gone = torch_dist.HashStore(), False

    def __getattr__(self, name: str):
        method = getattr(self.store, name)

        def call(*args, **kwargs):
            if self.gone:
                raise RuntimeError("Connection reset by peer")
            return method(*args, **kwargs)

        return call


def _watch_after_the_store_host(rank0_here: bool) -> health.PeerFailure | None:
    """Rank 1's view: rank 2 (this host) exited; rank 0 (this host or another) hosted the store."""
    store = _StoreOfAHost()
    rank0 = f"{process_space()} {_exited_process()}" if rank0_here else "another-host 7"
    store.set(PROCESS_KEY.format(0), rank0)
    store.set(PROCESS_KEY.format(2), f"{process_space()} {_exited_process()}")
    monitor = PeerMonitor(store, 1, 3, HeartbeatOptions(0.05, 4), on_dump_request=lambda reason: None)
    monitor.learn_processes(wait_s=1.0)
    store.gone = True
    return _failure_seen(monitor)


def test_a_peer_exiting_after_the_store_host_on_another_host_is_not_blamed() -> None:
    failure = _watch_after_the_store_host(rank0_here=False)
    assert failure is not None and failure.rank == 0, failure


def test_with_the_store_host_here_the_order_of_the_processes_decides() -> None:
    failure = _watch_after_the_store_host(rank0_here=True)
    assert failure is not None and failure.rank == 0, failure  # both gone: the lower rank first
