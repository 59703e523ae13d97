"""Rank bodies for tests/observability/test_comms_logger.py: a known op sequence whose counts and bytes are exact.

World of 3, every rank runs the same sequence (S as nccl-tests counts it)::

    3 x all_reduce             10 float32           S = 40
    1 x all_reduce async        10 float32           S = 40   (counted once wait() returns)
    2 x all_gather_into_tensor  4 int64 per rank     S = 3 * 32 = 96
    1 x broadcast               5 float64            S = 40
    1 x reduce_scatter_tensor   6 float32 input      S = 24
    1 x all_to_all_single       6 int32 input        S = 24
    1 x barrier                                      S = 0
    1 x isend to rank+1, 1 x irecv from rank-1       S = 28 each

Values are distinct per rank and element, and every result is checked exactly, so the logger is
shown not to disturb the data.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from commlayer import comms_logger, dist
from commlayer.facade.calls import dispatch

EXPECTED_COUNTS = {
    ("all_reduce", 40): 4,
    ("all_gather_into_tensor", 96): 2,
    ("broadcast", 40): 1,
    ("reduce_scatter_tensor", 24): 1,
    ("all_to_all_single", 24): 1,
    ("barrier", 0): 1,
    ("send", 28): 1,
    ("recv", 28): 1,
}


def known_sequence(trace_path: str) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    assert dispatch._observer is None, "the logger must not be on before enable()"
    comms_logger.enable()
    _run_sequence(rank, size)
    local = comms_logger.stats()
    counted = {(op, nbytes): row["count"] for op, sizes in local.items() for nbytes, row in sizes.items()}
    assert counted == EXPECTED_COUNTS, f"rank {rank}: {counted}"
    for op, sizes in local.items():
        for nbytes, row in sizes.items():
            assert row["total_bytes"] == row["count"] * nbytes, (op, nbytes, row)
            assert 0 < row["latency_us"]["min"] <= row["latency_us"]["avg"] <= row["latency_us"]["max"]

    combined = comms_logger.summary()  # its own all_gather_object must not be logged
    assert comms_logger.stats() == local, "summary() logged its own traffic"
    assert combined["world_size"] == size
    for (op, nbytes), count in EXPECTED_COUNTS.items():
        row = combined["ops"][op][nbytes]
        assert (row["count"], row["count_min"], row["count_max"]) == (count, count, count), (op, row)
        assert row["total_bytes"] == count * nbytes
        assert row["avg_us_min"] <= row["avg_us_max"] and row["fastest_rank"] in range(size)

    written = comms_logger.export_chrome_trace(trace_path)
    assert (written is not None) == (rank == 0)
    if rank == 0:
        _check_trace(Path(trace_path), size)
    _check_filter_and_disable(rank, size)


def _run_sequence(rank: int, size: int) -> None:
    values = torch.arange(10, dtype=torch.float32) + 100 * rank
    for _ in range(3):
        tensor = values.clone()
        dist.all_reduce(tensor)
        _same(tensor, sum(torch.arange(10, dtype=torch.float32) + 100 * r for r in range(size)), "all_reduce")
    tensor = values.clone()
    dist.all_reduce(tensor, async_op=True).wait()
    for _ in range(2):
        gathered = torch.empty(4 * size, dtype=torch.int64)
        dist.all_gather_into_tensor(gathered, torch.arange(4) + 10 * rank)
        _same(gathered, torch.cat([torch.arange(4) + 10 * r for r in range(size)]), "all_gather_into_tensor")
    root_values = torch.arange(5, dtype=torch.float64) * 3 + 1
    tensor = root_values.clone() if rank == 0 else torch.zeros(5, dtype=torch.float64)
    dist.broadcast(tensor, src=0)
    _same(tensor, root_values, "broadcast")
    _run_scatters(rank, size)
    dist.barrier()
    outgoing = torch.arange(7, dtype=torch.float32) + 1000 * rank
    incoming = torch.zeros(7, dtype=torch.float32)
    works = [dist.isend(outgoing, dst=(rank + 1) % size), dist.irecv(incoming, src=(rank - 1) % size)]
    for work in works:
        work.wait()
    _same(incoming, torch.arange(7, dtype=torch.float32) + 1000 * ((rank - 1) % size), "send/recv")


def _run_scatters(rank: int, size: int) -> None:
    inputs = [torch.arange(6, dtype=torch.float32) * (r + 1) for r in range(size)]
    output = torch.zeros(2, dtype=torch.float32)
    dist.reduce_scatter_tensor(output, inputs[rank])
    _same(output, sum(inputs)[2 * rank : 2 * rank + 2], "reduce_scatter_tensor")
    sent = [torch.arange(6, dtype=torch.int32) + 100 * r for r in range(size)]
    received = torch.zeros(6, dtype=torch.int32)
    dist.all_to_all_single(received, sent[rank])
    _same(received, torch.cat([sent[r][2 * rank : 2 * rank + 2] for r in range(size)]), "all_to_all_single")


def _check_trace(path: Path, size: int) -> None:
    trace = json.loads(path.read_text())
    complete = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    per_rank = {pid: sum(1 for event in complete if event["pid"] == pid) for pid in range(size)}
    assert per_rank == {pid: sum(EXPECTED_COUNTS.values()) for pid in range(size)}, per_rank
    assert all(event["dur"] > 0 and "bytes" in event["args"] for event in complete)
    names = {
        event["args"]["name"]
        for event in trace["traceEvents"]
        if event["ph"] == "M" and event["name"] == "process_name"
    }
    assert names == {f"rank {pid}" for pid in range(size)}


def _check_filter_and_disable(rank: int, size: int) -> None:
    comms_logger.reset()
    comms_logger.enable(ops=["all_gather"])  # a bench family: logs all_gather_into_tensor too
    tensor = torch.ones(3)
    dist.all_reduce(tensor)
    dist.all_gather_into_tensor(torch.empty(2 * size), torch.ones(2))
    assert list(comms_logger.stats()) == ["all_gather_into_tensor"], comms_logger.stats()
    comms_logger.disable()
    assert dispatch._observer is None and not comms_logger.is_enabled()
    dist.all_gather_into_tensor(torch.empty(2 * size), torch.ones(2))
    assert comms_logger.stats()["all_gather_into_tensor"][8 * size]["count"] == 1, (
        "disabled logger still counts"
    )


def _same(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    if not torch.equal(actual, expected.to(actual.dtype)):
        raise AssertionError(
            f"{what} on rank {dist.get_rank()}: expected {expected.tolist()}, got {actual.tolist()}"
        )
