"""Which rank did not call the collective that timed out: the ranks compare their progress.

When a collective times out, the rank asks every peer, through the store, for the last
collective each entered on every group (its flight recorder's sequence number and op). The
peers' monitors answer at their next beat, from their own thread, even while their main thread
is busy elsewhere. A peer behind on the group skipped the collective; one at the same number
with another op called something else; one that never answers is hung with the GIL held, or dead.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from commlayer.facade.groups.group import ProcessGroup, world_or_none
from commlayer.facade.monitor.peer_monitor import monitor_store
from commlayer.facade.monitor.peer_thread import HeartbeatOptions, add_beat_hook

__all__ = ["describe_laggards", "install"]

log = logging.getLogger("commlayer.dist")

_REQUEST = "commlayer/progress/request"
_ANSWER = "commlayer/progress/rank/{}"
# The last request answered, per store connection (a new world starts its counter again).
_answered: dict[int, int] = {}


def install() -> None:
    """Let this rank's peer monitor answer progress requests."""
    add_beat_hook(_answer)


def _last_collectives() -> dict[str, list[Any]]:
    world = world_or_none()
    if world is None:
        return {}
    groups = (world.default_group, *world.groups.values())
    return {group.group_name: _last_collective(group) for group in groups}


def _last_collective(group: ProcessGroup) -> list[Any]:
    entries = [entry for entry in group.recorder.snapshot() if not entry["op"].startswith("p2p:")]
    return [entries[-1]["seq"], entries[-1]["op"]] if entries else [0, ""]


def _answer(store: Any, rank: int) -> None:
    request = store.add(_REQUEST, 0)
    if request > _answered.get(id(store), 0):
        _answered[id(store)] = request
        store.set(_ANSWER.format(rank), json.dumps({"request": request, "groups": _last_collectives()}))


def describe_laggards(group: ProcessGroup) -> str:
    """Why ``group``'s last collective on this rank did not complete, as far as the peers tell
    (bounded by two beats); empty when every peer entered it too."""
    store, rank = monitor_store()
    if store is None:
        return ""
    try:
        answers = _ask(store, rank, group)
    except Exception as error:  # noqa: BLE001 - the timeout itself is the error to raise
        log.debug("commlayer: could not compare progress with the peers: %s", error)
        return ""
    seq, op = _last_collective(group)
    notes = []
    for peer in group.ranks:
        if peer == rank:
            continue
        theirs = answers.get(peer)
        if theirs is None:
            notes.append(f"rank {peer} did not answer (hung with the GIL held, or dead)")
            continue
        peer_seq, peer_op = theirs.get(group.group_name, [0, ""])
        if peer_seq < seq:
            last = f"#{peer_seq} {peer_op}" if peer_seq else "none"
            notes.append(
                f"rank {peer} did not call {op} (#{seq}); its last collective on the group was {last}"
            )
        elif peer_seq == seq and peer_op != op:
            notes.append(f"rank {peer} called {peer_op} as collective #{seq} where this rank called {op}")
    return "; ".join(notes)


def _ask(store: Any, rank: int, group: ProcessGroup) -> dict[int, dict[str, Any]]:
    request = store.add(_REQUEST, 1)
    _answer(store, rank)
    deadline = time.monotonic() + 2 * HeartbeatOptions.from_env().interval_s + 0.5
    answers: dict[int, dict[str, Any]] = {}
    while True:
        for peer in group.ranks:
            if peer not in answers and store.check([_ANSWER.format(peer)]):
                answer = json.loads(store.get(_ANSWER.format(peer)))
                if answer["request"] >= request:
                    answers[peer] = answer["groups"]
        if len(answers) == len(group.ranks) or time.monotonic() >= deadline:
            return answers
        time.sleep(0.02)
