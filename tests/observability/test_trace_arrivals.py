"""``trace analyze --arrivals``, on dumps written by hand: entry times placed on the wall clock
through each rank's own clock pair, spreads, the rank furthest behind, and what is left out."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from commlayer.core.flight_recorder import write_dump
from commlayer.trace_analysis import arrivals, describe_arrivals, load_dumps, main

MS = 1_000_000  # nanoseconds


def _dump(rank: int, entered_ms: dict[int, float], clock_ms: float, group: str = "world") -> dict:
    """A dump whose monotonic clock reads ``clock_ms`` less than the shared wall clock: entries
    ``seq -> entered_ms`` are given on the wall clock and stored on the rank's own clock."""
    entries = [
        {"seq": seq, "op": "all_gather_into_tensor" if seq == 3 else "all_reduce", "shape": [4],
         "dtype": "float32", "state": "completed", "queued_ns": round((ms - clock_ms) * MS)}
        for seq, ms in entered_ms.items()
    ]  # fmt: skip
    return {
        "rank": rank,
        "world_size": 3,
        "reason": "request",
        "time": 1000.0,  # the wall clock at the dump, in seconds
        "monotonic_ns": round((1000_000.0 - clock_ms) * MS),
        "groups": [
            {"group": group, "ranks": [0, 1, 2], "last_collective": max(entered_ms), "entries": entries}
        ],
    }


def test_entries_are_lined_up_on_the_wall_clock_and_the_late_rank_named(tmp_path: Path) -> None:
    # Wall-clock entry times (ms); each rank's monotonic clock has a different origin.
    write_dump(tmp_path, 0, _dump(0, {1: 10.0, 2: 20.0, 3: 30.0}, clock_ms=500.0))
    write_dump(tmp_path, 1, _dump(1, {1: 10.5, 2: 24.0, 3: 30.2}, clock_ms=-7000.0))
    write_dump(tmp_path, 2, _dump(2, {1: 10.1, 2: 20.0, 3: 31.0, 4: 40.0}, clock_ms=123.0))
    (found,) = arrivals(load_dumps(tmp_path))
    assert sorted(found.behind) == [1, 2, 3]  # #4: only rank 2 entered it
    assert found.spreads() == pytest.approx({1: 0.5e-3, 2: 4e-3, 3: 1e-3})
    assert found.lateness() == pytest.approx({0: 0.0, 1: 4.7e-3, 2: 1.1e-3})
    assert found.last_counts() == {0: 0, 1: 2, 2: 1}
    line = describe_arrivals(found, most=2)
    assert line == (
        "group 'world' (ranks 0, 1, 2): arrivals at 3 collectives: spread median 1 ms, total 5.5 ms, "
        "widest 4 ms at all_reduce #2; behind the first: rank 1 4.7 ms (last at 2), rank 2 1.1 ms (last at 1)"
    )


def test_dumps_without_their_clocks_leave_too_few_members_to_time(tmp_path: Path) -> None:
    write_dump(tmp_path, 0, _dump(0, {1: 10.0}, clock_ms=0.0))
    for rank, missing in ((1, "time"), (2, "monotonic_ns")):
        dump = _dump(rank, {1: 11.0}, clock_ms=0.0)
        del dump[missing]
        write_dump(tmp_path, rank, dump)
    assert arrivals(load_dumps(tmp_path)) == []
    out = io.StringIO()
    assert main(str(tmp_path), out=out, with_arrivals=True) == 0
    assert (
        out.getvalue()
        .rstrip()
        .endswith("arrivals: no collective that two or more dumped members of a group entered")
    ), out.getvalue()
