"""The comms logger. Tier 1: merging ranks, the table, the trace. Tier 2: enable/disable wiring
and the environment switch. Tier 3: exact counts and bytes over a known sequence on 3 ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from commlayer import comms_logger, dist
from commlayer.comms_logger.logger import LoggerOptions, TraceEvent
from commlayer.comms_logger.summary import chrome_trace, combine_ranks, format_summary
from commlayer.facade.calls import dispatch
from commlayer.testing import run_world


def _totals(count: int, total_s: float, min_s: float, max_s: float, bus_bytes: float) -> dict[str, float]:
    return {"count": count, "total_s": total_s, "min_s": min_s, "max_s": max_s, "bus_bytes": bus_bytes}


def test_combine_ranks_reports_min_and_max_across_ranks() -> None:
    per_rank = [
        {"rank": 0, "totals": {"all_reduce\t1000": _totals(4, 0.004, 0.0005, 0.002, 4000.0)}},
        {
            "rank": 1,
            "totals": {
                "all_reduce\t1000": _totals(4, 0.001, 0.0002, 0.0003, 4000.0),
                "barrier\t0": _totals(1, 0.1, 0.1, 0.1, 0.0),
            },
        },
    ]
    combined = combine_ranks(per_rank)
    row = combined["ops"]["all_reduce"][1000]
    assert combined["world_size"] == 2
    assert (row["count"], row["count_min"], row["count_max"], row["total_bytes"]) == (4, 4, 4, 4000)
    assert (row["avg_us_min"], row["fastest_rank"]) == (pytest.approx(250.0), 1)
    assert (row["avg_us_max"], row["slowest_rank"]) == (pytest.approx(1000.0), 0)
    assert (row["min_us"], row["max_us"]) == (pytest.approx(200.0), pytest.approx(2000.0))
    assert row["algbw_gbps"] == pytest.approx(4000 / 0.004 / 1e9)  # from the slowest rank's mean
    barrier = combined["ops"]["barrier"][0]
    assert (barrier["count"], barrier["count_min"], barrier["count_max"]) == (1, 0, 1)  # rank 0 never ran it
    text = format_summary(combined)
    assert "all_reduce" in text and "250.0 (r1)" in text and "1000.0 (r0)" in text and "0-1" in text


def test_chrome_trace_has_a_process_per_rank_and_complete_events() -> None:
    event = TraceEvent("all_reduce", 64, 1_000.0, 12.5, "gloo", "world", 2)
    trace = chrome_trace([(0, [event], 0), (1, [event, event], 3)])
    complete = [item for item in trace["traceEvents"] if item["ph"] == "X"]
    assert [item["pid"] for item in complete] == [0, 1, 1]
    assert complete[0] | {"args": None} == {
        "name": "all_reduce",
        "cat": "gloo",
        "ph": "X",
        "ts": 1000.0,
        "dur": 12.5,
        "pid": 0,
        "tid": 0,
        "args": None,
    }
    assert trace["otherData"]["dropped_events_by_rank"] == {"1": 3}
    json.dumps(trace)  # serialisable as is


def test_op_filter_accepts_facade_names_and_bench_families() -> None:
    options = LoggerOptions(ops=frozenset({"all_gather", "broadcast"}))
    assert (
        options.wants("all_gather_into_tensor") and options.wants("all_gather") and options.wants("broadcast")
    )
    assert not options.wants("all_reduce")
    assert LoggerOptions().wants("anything")


@pytest.fixture
def logger_off() -> Iterator[None]:
    comms_logger.disable()
    comms_logger.reset()
    try:
        yield
    finally:
        comms_logger.disable()
        comms_logger.reset()


def test_enable_sets_the_facade_observer_and_disable_removes_it(world_of_one: None, logger_off: None) -> None:
    assert dispatch._observer is None
    comms_logger.enable(ops="all_reduce,broadcast")
    assert comms_logger.is_enabled() and dispatch._observer is not None
    tensor = torch.arange(6, dtype=torch.float32)
    dist.all_reduce(tensor)
    dist.broadcast(tensor, src=0)
    dist.all_gather_into_tensor(torch.empty(6), tensor)  # filtered out
    assert torch.equal(tensor, torch.arange(6, dtype=torch.float32))
    assert {op: list(sizes) for op, sizes in comms_logger.stats().items()} == {
        "all_reduce": [24],
        "broadcast": [24],
    }
    comms_logger.disable()
    assert dispatch._observer is None
    dist.all_reduce(tensor)
    assert comms_logger.stats()["all_reduce"][24]["count"] == 1
    summary = comms_logger.summary(print_rank=None)
    assert summary["ops"]["all_reduce"][24]["count"] == 1 and summary["world_size"] == 1


def test_environment_switch_enables_at_import_and_reports_at_exit(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import torch
        from commlayer import comms_logger, dist
        assert comms_logger.is_enabled()
        dist.init_process_group("gloo")
        tensor = torch.ones(4)
        dist.all_reduce(tensor); dist.all_reduce(tensor); dist.broadcast(tensor, src=0)
        print(sorted((op, n, row["count"]) for op, sizes in comms_logger.stats().items() for n, row in sizes.items()))
        dist.destroy_process_group()
    """)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env |= {
        "COMMLAYER_COMMS_LOGGER": "1",
        "COMMLAYER_COMMS_LOGGER_OPS": "all_reduce",
        "COMMLAYER_COMMS_LOGGER_TRACE": str(tmp_path / "trace-{rank}.json"),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[('all_reduce', 16, 2)]"
    assert "# comms logger: 1 rank" in done.stderr and "all_reduce" in done.stderr
    trace = json.loads((tmp_path / "trace-0.json").read_text())
    assert sum(1 for event in trace["traceEvents"] if event["ph"] == "X") == 2


@pytest.mark.multirank
def test_counts_and_bytes_are_exact_for_a_known_sequence(tmp_path: Path) -> None:
    run_world(
        "tests.observability.comms_logger_ranks:known_sequence",
        3,
        args=[str(tmp_path / "trace.json")],
        timeout=120,
    )
