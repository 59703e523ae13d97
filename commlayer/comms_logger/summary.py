"""Pure helpers of the comms logger: merge per-rank records, format the table, build a trace.

Kept apart from :mod:`commlayer.comms_logger` so that they are tested without any world, and so
that enabling the logger imports nothing it does not need per call.

Example, 2 ranks that each ran 3 all_reduces of 4 KiB, rank 1 arriving late each time::

    op                 bytes  count  avg_us min (rank)  avg_us max (rank)   min_us   max_us  algbw_GB/s  busbw_GB/s
    all_reduce          4096      3        41.0 (r1)       390.2 (r0)        39.8    401.7       0.010       0.010
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["chrome_trace", "combine_ranks", "format_summary"]


def combine_ranks(per_rank: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge ``[{"rank": r, "totals": {"op\\tS": accumulator fields}}, ...]`` into summary rows."""
    keys = sorted({_split(key) for snapshot in per_rank for key in snapshot["totals"]})
    ops: dict[str, dict[int, dict[str, Any]]] = {}
    for op, nbytes in keys:
        ops.setdefault(op, {})[nbytes] = _combine_key(per_rank, f"{op}\t{nbytes}", nbytes)
    return {"world_size": len(per_rank), "ops": ops}


def _combine_key(per_rank: Sequence[dict[str, Any]], key: str, nbytes: int) -> dict[str, Any]:
    counts = [snapshot["totals"].get(key, {}).get("count", 0) for snapshot in per_rank]
    present = [
        (snapshot["rank"], snapshot["totals"][key]) for snapshot in per_rank if key in snapshot["totals"]
    ]
    means = [(totals["total_s"] / totals["count"], rank) for rank, totals in present]
    fastest_s, fastest_rank = min(means)
    slowest_s, slowest_rank = max(means)
    slowest = dict(present)[slowest_rank]
    return {
        "count": max(counts),
        "count_min": min(counts),
        "count_max": max(counts),
        "total_bytes": max(counts) * nbytes,
        "avg_us_min": fastest_s * 1e6,
        "fastest_rank": fastest_rank,
        "avg_us_max": slowest_s * 1e6,
        "slowest_rank": slowest_rank,
        "min_us": min(totals["min_s"] for _, totals in present) * 1e6,
        "max_us": max(totals["max_s"] for _, totals in present) * 1e6,
        "algbw_gbps": _rate(slowest["count"] * nbytes, slowest["total_s"]),
        "busbw_gbps": _rate(slowest["bus_bytes"], slowest["total_s"]),
    }


def format_summary(combined: dict[str, Any]) -> str:
    ranks = combined["world_size"]
    lines = [
        (
            f"# comms logger: {ranks} rank{'s' if ranks != 1 else ''}; avg_us min/max = lowest/highest per-rank "
            "mean latency (the lowest is the likely straggler: it arrived last)"
        ),
        (
            f"{'op':<24}{'bytes':>12}{'count':>9}{'avg_us min (rank)':>20}{'avg_us max (rank)':>20}"
            f"{'min_us':>11}{'max_us':>11}{'algbw_GB/s':>12}{'busbw_GB/s':>12}"
        ),
    ]
    for op, sizes in combined["ops"].items():
        for nbytes, row in sizes.items():
            count = (
                str(row["count"])
                if row["count_min"] == row["count_max"]
                else f"{row['count_min']}-{row['count_max']}"
            )
            fastest = f"{row['avg_us_min']:.1f} (r{row['fastest_rank']})"
            slowest = f"{row['avg_us_max']:.1f} (r{row['slowest_rank']})"
            lines.append(
                f"{op:<24}{nbytes:>12}{count:>9}{fastest:>20}{slowest:>20}{row['min_us']:>11.1f}{row['max_us']:>11.1f}"
                f"{_gbps(row['algbw_gbps']):>12}{_gbps(row['busbw_gbps']):>12}"
            )
    if not combined["ops"]:
        lines.append("(no ops recorded)")
    return "\n".join(lines)


def chrome_trace(per_rank: Sequence[tuple[int, Sequence[Any], int]]) -> dict[str, Any]:
    """Chrome trace-event JSON: a complete ("X") event per op, one process per rank."""
    events: list[dict[str, Any]] = []
    dropped: dict[str, int] = {}
    for rank, rank_events, rank_dropped in per_rank:
        events.append(
            {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}}
        )
        events.append(
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}
        )
        events.extend(_trace_event(rank, event) for event in rank_events)
        if rank_dropped:
            dropped[str(rank)] = rank_dropped
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"dropped_events_by_rank": dropped}}


def _trace_event(rank: int, event: Any) -> dict[str, Any]:
    return {
        "name": event.op,
        "cat": event.backend,
        "ph": "X",
        "ts": event.start_us,
        "dur": event.duration_us,
        "pid": rank,
        "tid": 0,
        "args": {
            "bytes": event.nbytes,
            "group": event.group,
            "group_size": event.group_size,
            "backend": event.backend,
        },
    }


def _split(key: str) -> tuple[str, int]:
    op, nbytes = key.split("\t")
    return op, int(nbytes)


def _rate(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def _gbps(value: float) -> str:
    return f"{value:.3f}" if value >= 0.001 or value == 0 else f"{value:.2e}"
