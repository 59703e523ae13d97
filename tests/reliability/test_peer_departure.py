"""The peer monitor tells a peer that shut its world down cleanly from one that died.

A rank may finish the last collective and exit while a peer is still completing it; the monitor
must not abort that peer's call with a failure that did not happen.
"""

from __future__ import annotations

import subprocess
import sys
import time

import torch.distributed as torch_dist

from commlayer.core import health
from commlayer.core.processes import process_space
from commlayer.facade.monitor.peer_thread import LEFT_KEY, PROCESS_KEY, HeartbeatOptions, PeerMonitor


def _watch_an_exited_peer(departed: bool) -> health.PeerFailure | None:
    store = torch_dist.HashStore()
    peer = subprocess.Popen([sys.executable, "-c", "pass"])
    peer.wait()
    store.set(PROCESS_KEY.format(1), f"{process_space()} {peer.pid}")
    if departed:
        store.set(LEFT_KEY.format(1), "1")
    health.clear()
    monitor = PeerMonitor(store, 0, 2, HeartbeatOptions(0.05, 4), on_dump_request=lambda reason: None)
    monitor.start()
    time.sleep(0.5)
    monitor.stop()
    failure = health.current()
    health.clear()
    return failure


def test_a_peer_that_destroyed_its_world_and_exited_is_not_a_failure() -> None:
    assert _watch_an_exited_peer(departed=True) is None


def test_a_peer_that_exited_without_leaving_is_named_dead() -> None:
    failure = _watch_an_exited_peer(departed=False)
    assert failure is not None and failure.rank == 1, failure
