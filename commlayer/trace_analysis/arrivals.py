"""When each rank entered the collectives of a running job: who arrives last, and by how much.

A dump records, for every collective, when the rank entered it (``queued_ns``, the rank's monotonic
clock), and once the monotonic and the wall clock at the time of the dump; together they place
every entry on the wall clock. Ranks of one host share the monotonic clock, so there the figures
hold to the microsecond; across hosts they carry the hosts' clock offset.

For each collective that every dumped member of a group entered, the spread is the time from the
first rank's entry to the last one's: how long the early ranks (their devices, for GPU calls) can
wait at that call for the late one. Summed over a rank's calls, the time it entered after the
first rank names the straggler::

    group 'NAME' (ranks ...): arrivals at N collectives: spread median M, total T, widest W at
    OP #SEQ; behind the first: rank R TIME (last at K), ... (the three furthest behind)
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from commlayer.core.errors import describe_ranks
from commlayer.core.metrics import format_duration
from commlayer.trace_analysis.findings import GroupView, group_names

__all__ = ["Arrivals", "arrivals", "describe_arrivals"]


@dataclass(frozen=True)
class Arrivals:
    """One group's entry times, lined up by sequence number (seconds after the first rank's)."""

    group: str
    ranks: tuple[int, ...]
    behind: Mapping[int, Mapping[int, float]]  # seq -> rank -> seconds after the first entry
    ops: Mapping[int, str]  # seq -> op

    def spreads(self) -> dict[int, float]:
        """Per collective, the first entry to the last."""
        return {seq: max(times.values()) for seq, times in self.behind.items()}

    def lateness(self) -> dict[int, float]:
        """Per rank, its entries' time after the first rank's, summed over the collectives."""
        total = dict.fromkeys(self.ranks, 0.0)
        for times in self.behind.values():
            for rank, seconds in times.items():
                total[rank] += seconds
        return total

    def last_counts(self) -> dict[int, int]:
        """Per rank, at how many collectives it entered last."""
        counts = dict.fromkeys(self.ranks, 0)
        for times in self.behind.values():
            counts[max(times, key=times.__getitem__)] += 1
        return counts


def arrivals(dumps: Mapping[int, dict[str, Any]]) -> list[Arrivals]:
    """The arrivals of every group two or more dumped members of which entered a collective."""
    offsets = {rank: _wall_offset_ns(dump) for rank, dump in dumps.items()}
    found = []
    for name in group_names(dumps):
        view = GroupView.collect(name, dumps)
        timed = {rank: by_seq for rank, by_seq in view.entries.items() if offsets[rank] is not None}
        if len(timed) < 2:
            continue
        common = set.intersection(*(set(by_seq) for by_seq in timed.values()))
        behind, ops = {}, {}
        for seq in sorted(common):
            entered = {rank: by_seq[seq].get("queued_ns", 0) for rank, by_seq in timed.items()}
            if all(entered.values()):
                wall = {rank: ns + offsets[rank] for rank, ns in entered.items()}
                first = min(wall.values())
                behind[seq] = {rank: (ns - first) / 1e9 for rank, ns in wall.items()}
                ops[seq] = timed[min(timed)][seq]["op"]
        if behind:
            found.append(Arrivals(name, tuple(sorted(timed)), behind, ops))
    return found


def describe_arrivals(found: Arrivals, most: int = 3) -> str:
    """One line: the spreads, the widest one, and the ranks furthest behind (``most`` of them)."""
    spreads = found.spreads()
    widest = max(spreads, key=spreads.__getitem__)
    lateness, lasts = found.lateness(), found.last_counts()
    slowest = sorted(found.ranks, key=lambda rank: -lateness[rank])[:most]
    behind = ", ".join(
        f"rank {rank} {format_duration(lateness[rank])} (last at {lasts[rank]})" for rank in slowest
    )
    return (
        f"group '{found.group}' ({describe_ranks(found.ranks)}): arrivals at {len(spreads)} collectives: "
        f"spread median {format_duration(statistics.median(spreads.values()))}, "
        f"total {format_duration(sum(spreads.values()))}, widest {format_duration(spreads[widest])} "
        f"at {found.ops[widest]} #{widest}; behind the first: {behind}"
    )


def _wall_offset_ns(dump: dict[str, Any]) -> int | None:
    """The rank's wall clock minus its monotonic clock, from the pair its dump recorded."""
    if "time" not in dump or "monotonic_ns" not in dump:
        return None
    return round(float(dump["time"]) * 1e9) - int(dump["monotonic_ns"])
