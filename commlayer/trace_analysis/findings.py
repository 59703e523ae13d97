"""What the dumps of one job say: who is missing, mismatched calls, who waits where.

Each rank's dump (``rank<N>.json``, see :mod:`commlayer.core.flight_recorder`) lists the last
collectives of every group it belongs to. Lined up by sequence number they answer the questions a
hang raises. Example, rank 2 of 4 stuck in computation while the others wait::

    group 'world' (ranks 0, 1, 2, 3): rank 2 never entered all_reduce #1234 (ranks 0, 1, 3 are
    waiting in it); rank 2's last collective there was #1233 broadcast (completed)
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from commlayer.core.errors import describe_ranks

__all__ = ["GroupView", "analyze", "describe", "group_names"]

_SHAPE_FREE_OPS = frozenset({"all_to_all", "all_to_all_single"})


@dataclass(frozen=True)
class GroupView:
    """One group's collectives as each rank that dumped recorded them: rank -> seq -> entry."""

    name: str
    ranks: tuple[int, ...]
    entries: Mapping[int, Mapping[int, dict[str, Any]]]
    last: Mapping[int, int]  # rank -> last collective it entered

    @classmethod
    def collect(cls, name: str, dumps: Mapping[int, dict[str, Any]]) -> GroupView:
        entries: dict[int, dict[int, dict[str, Any]]] = {}
        last: dict[int, int] = {}
        ranks: tuple[int, ...] = ()
        for rank, dump in dumps.items():
            for group in dump.get("groups", []):
                if group["group"] == name:
                    ranks = tuple(group["ranks"])
                    collectives = [entry for entry in group["entries"] if not entry["op"].startswith("p2p:")]
                    entries[rank] = {entry["seq"]: entry for entry in collectives}
                    last[rank] = int(group["last_collective"])
        return cls(name, ranks, entries, last)

    def finished(self, rank: int, seq: int) -> bool:
        """Whether ``rank`` finished collective ``seq``: completed, or an async op whose Work the
        caller dropped ("released") followed by a later completed one (a group's collectives
        finish in order)."""
        state = self.entries[rank][seq]["state"]
        if state != "released":
            return state == "completed"
        return seq < self._latest_completed.get(rank, 0)

    @functools.cached_property
    def _latest_completed(self) -> dict[int, int]:
        return {
            rank: max((seq for seq, entry in by_seq.items() if entry["state"] == "completed"), default=0)
            for rank, by_seq in self.entries.items()
        }

    def first_unfinished(self) -> int | None:
        """The lowest sequence number some member has not finished (or never entered)."""
        candidates = [max(self.last.values()) + 1] if self.last else []
        for rank, by_seq in self.entries.items():
            candidates += [seq for seq in by_seq if not self.finished(rank, seq)]
            if self.last[rank] < max(self.last.values()):
                candidates.append(self.last[rank] + 1)
        first = min(candidates, default=None)
        return None if first is None or first > max(self.last.values(), default=0) else first


def analyze(dumps: Mapping[int, dict[str, Any]]) -> list[str]:
    """Human-readable findings, most useful first: who is missing, mismatches, who is waiting."""
    world_size = max(int(dump.get("world_size", 0)) for dump in dumps.values())
    missing = sorted(set(range(world_size)) - set(dumps))
    lines = [f"dumps from {describe_ranks(sorted(dumps))} of a world of {world_size}"]
    if missing:
        lines.append(f"no dump from {describe_ranks(missing)} (dead, hung with the GIL held, or never asked)")
    reasons = {rank: dump.get("reason", "") for rank, dump in sorted(dumps.items())}
    lines += [f"rank {rank} dumped because: {reason}" for rank, reason in reasons.items() if reason]
    for name in group_names(dumps):
        view = GroupView.collect(name, dumps)
        lines += _mismatches(view)
        lines.append(_progress(view, set(dumps)))
    lines += _pending_p2p(dumps)
    return lines


def group_names(dumps: Mapping[int, dict[str, Any]]) -> list[str]:
    """Every group any dump holds, in the order the lowest rank's dump lists them."""
    names: dict[str, None] = {}
    for _, dump in sorted(dumps.items()):
        for group in dump.get("groups", []):
            names.setdefault(group["group"], None)
    return list(names)


def _signature(entry: dict[str, Any]) -> tuple[Any, ...]:
    if entry["op"] in _SHAPE_FREE_OPS:
        return (entry["op"], entry["dtype"])
    return (entry["op"], entry["dtype"], json.dumps(entry["shape"]), entry.get("root", -1))


def describe(entry: dict[str, Any]) -> str:
    """``all_reduce #12 (float32[4], completed)``."""
    shape = entry["shape"]
    dims = "; ".join(map(str, shape)) if shape and isinstance(shape[0], list) else str(shape)
    root = f", root {entry['root']}" if entry.get("root", -1) >= 0 else ""
    return f"{entry['op']} #{entry['seq']} ({entry['dtype']}{dims}{root}, {entry['state']})"


def _mismatches(view: GroupView) -> list[str]:
    findings = []
    common = set.intersection(*(set(by_seq) for by_seq in view.entries.values())) if view.entries else set()
    for seq in sorted(common):
        calls = {rank: by_seq[seq] for rank, by_seq in view.entries.items()}
        if len({_signature(entry) for entry in calls.values()}) > 1:
            listing = "; ".join(f"rank {rank}: {describe(entry)}" for rank, entry in sorted(calls.items()))
            findings.append(f"group '{view.name}': MISMATCH at collective #{seq}: {listing}")
            break  # later entries are shifted by the first mismatch: one finding is the useful one
    return findings


def _progress(view: GroupView, dumped: set[int]) -> str:
    header = f"group '{view.name}' ({describe_ranks(view.ranks)})"
    seq = view.first_unfinished()
    if seq is None:
        final = max(view.last.values(), default=0)
        parts = [f"every rank that dumped completed collective #{final}, the last one entered"]
        return f"{header}: " + "; ".join(parts + _unaccounted(view, dumped))
    inside = {rank: by_seq[seq] for rank, by_seq in view.entries.items() if seq in by_seq}
    op = next(iter(inside.values()))["op"] if inside else "collective"
    never = sorted(rank for rank, last in view.last.items() if last < seq)
    raised = sorted(rank for rank, entry in inside.items() if entry["state"] == "failed")
    released = sorted(
        rank
        for rank, entry in inside.items()
        if entry["state"] == "released" and not view.finished(rank, seq)
    )
    waiting = sorted(
        rank for rank, entry in inside.items() if entry["state"] not in ("completed", "failed", "released")
    )
    parts = []
    if never:
        parts.append(f"{describe_ranks(never)} never entered {op} #{seq}")
    if raised:
        parts.append(f"{describe_ranks(raised)} raised in {op} #{seq}")
    if waiting:
        verb = "is" if len(waiting) == 1 else "are"
        parts.append(f"{describe_ranks(waiting)} {verb} waiting in {op} #{seq}")
    if released:
        parts.append(
            f"{describe_ranks(released)} dropped the Work of {op} #{seq} before the dump "
            "(whether it finished is not recorded)"
        )
    for rank in never:
        previous = view.entries[rank].get(view.last[rank])
        if previous is not None:
            parts.append(f"rank {rank}'s last collective there was {describe(previous)}")
    return f"{header}: " + "; ".join(parts + _unaccounted(view, dumped))


def _unaccounted(view: GroupView, dumped: set[int]) -> list[str]:
    """Members whose dump is missing (dead or unreachable) or holds no record of the group."""
    absent = sorted(set(view.ranks) - dumped)
    without = sorted((set(view.ranks) & dumped) - set(view.entries))
    parts = []
    if absent:
        parts.append(f"{describe_ranks(absent)} left no dump (dead or unreachable)")
    if without:
        parts.append(
            f"{describe_ranks(without)} dumped without this group (destroyed or never created there)"
        )
    return parts


def _pending_p2p(dumps: Mapping[int, dict[str, Any]]) -> list[str]:
    lines = []
    for rank, dump in sorted(dumps.items()):
        for group in dump.get("groups", []):
            for entry in group["entries"]:
                if entry["op"].startswith("p2p:") and entry["state"] not in ("completed", "released"):
                    lines.append(
                        f"rank {rank}: {describe(entry)} on group '{group['group']}' never completed"
                    )
    return lines
