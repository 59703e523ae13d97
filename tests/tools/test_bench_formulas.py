"""Tier 1 (pure logic) of ``commlayer bench``: busbw factors, sizes, check values, options, outputs."""

from __future__ import annotations

import csv
import io
import json
import threading
from fractions import Fraction

import pytest
import torch

from commlayer.bench.cases import ValuePattern, check_values_exact, layout
from commlayer.bench.options import BENCH_DTYPES, BenchOptions
from commlayer.bench.progress import ProgressBar, StepFileWriter, follow_file
from commlayer.bench.records import RECORD_KEYS, BenchRecord, SweepResult, read_json, write_csv, write_json
from commlayer.bench.table import format_report, format_side_by_side
from commlayer.core.metrics import algbw_gbps, busbw_factor, busbw_gbps, format_size, parse_size, size_sweep

# nccl-tests doc/PERFORMANCE.md, written out as exact fractions of n.
EXPECTED_FACTORS = {
    "all_reduce": lambda n: Fraction(2 * (n - 1), n),
    "all_gather": lambda n: Fraction(n - 1, n),
    "reduce_scatter": lambda n: Fraction(n - 1, n),
    "all_to_all": lambda n: Fraction(n - 1, n),
    "broadcast": lambda n: Fraction(1),
    "pingpong": lambda n: Fraction(1),
}


@pytest.mark.parametrize("op", sorted(EXPECTED_FACTORS))
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8, 16])
def test_busbw_factor_matches_nccl_tests(op: str, world_size: int) -> None:
    assert busbw_factor(op, world_size) == pytest.approx(
        float(EXPECTED_FACTORS[op](world_size)), abs=0, rel=1e-15
    )


@pytest.mark.parametrize(
    ("facade_op", "family"),
    [
        ("all_gather_into_tensor", "all_gather"),
        ("reduce_scatter_tensor", "reduce_scatter"),
        ("all_to_all_single", "all_to_all"),
        ("send", "pingpong"),
        ("recv", "pingpong"),
    ],
)
def test_facade_op_names_use_their_family_factor(facade_op: str, family: str) -> None:
    assert busbw_factor(facade_op, 4) == busbw_factor(family, 4)


def test_bandwidths_in_gigabytes_per_second() -> None:
    assert algbw_gbps(2 * 10**9, 1.0) == 2.0
    # 1 GB all_reduce in 1 s over 4 ranks: busbw = 2 * 3/4 GB/s; DeepSpeed would report 2 GB/s.
    assert busbw_gbps("all_reduce", 10**9, 1.0, 4) == 1.5
    assert busbw_gbps("all_gather", 8 * 10**9, 2.0, 8) == 3.5
    assert algbw_gbps(0, 1.0) == 0.0 and algbw_gbps(8, 0.0) == 0.0


def test_busbw_factor_rejects_an_empty_world() -> None:
    with pytest.raises(ValueError, match="world_size expected >= 1, received 0"):
        busbw_factor("all_reduce", 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("1K", 1024),
        ("64k", 65536),
        ("16M", 16 << 20),
        ("1G", 1 << 30),
        ("1GB", 1 << 30),
        ("0.5K", 512),
        ("2MiB", 2 << 20),
        (4096, 4096),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "1X", "-8", "1.3", "K"])
def test_parse_size_rejects_malformed_sizes(text: str) -> None:
    with pytest.raises(ValueError, match="expected"):
        parse_size(text)


def test_format_size() -> None:
    assert [format_size(n) for n in (8, 1024, 1536, 1 << 20, 1 << 30)] == ["8", "1K", "1.5K", "1M", "1G"]


def test_size_sweep() -> None:
    assert size_sweep(8, 64, 2) == [8, 16, 32, 64]
    assert size_sweep(8, 100, 4) == [8, 32]
    assert size_sweep(8, 8, 2) == [8]
    assert size_sweep(1, 4, 1.5) == [1, 2, 3, 4]  # always progresses, even when rounding would stall
    assert len(size_sweep(8, 1 << 30, 2)) == 28


@pytest.mark.parametrize(("low", "high", "factor"), [(0, 8, 2), (16, 8, 2), (8, 64, 1)])
def test_size_sweep_rejects_bad_ranges(low: int, high: int, factor: float) -> None:
    with pytest.raises(ValueError, match="size sweep: expected"):
        size_sweep(low, high, factor)


def test_layout_rounds_to_whole_elements_and_chunks() -> None:
    assert layout("all_reduce", 10, torch.float32, 3).nbytes == 8
    assert layout("all_reduce", 1, torch.float64, 3).count == 1  # never empty
    assert layout("all_gather", 16, torch.float32, 3).count == 3  # S holds whole per-rank chunks
    assert layout("reduce_scatter", 8, torch.float32, 4).count == 4
    assert layout("all_to_all", 64, torch.int8, 3).nbytes == 63
    assert layout("barrier", 1 << 20, torch.float32, 2).nbytes == 0


@pytest.mark.parametrize("dtype", list(BENCH_DTYPES.values()))
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_check_values_are_exact_and_distinct(dtype: torch.dtype, world_size: int) -> None:
    """Every rank's values, and their sum over ranks, survive the dtype exactly."""
    pattern = ValuePattern(world_size, dtype)
    count, cpu = pattern.period + 2, torch.device("cpu")  # every pattern value, largest included
    wide = [pattern.rank_values(rank, 0, count, 5, cpu).to(torch.float64) for rank in range(world_size)]
    exact = [
        1 + rank + world_size * pattern.pattern(0, count, 5, cpu).to(torch.float64)
        for rank in range(world_size)
    ]
    assert all(torch.equal(value, reference) for value, reference in zip(wide, exact))
    assert torch.equal(pattern.summed(0, count, 5, cpu).to(torch.float64), sum(exact))
    if world_size > 1:
        assert not torch.equal(wide[0], wide[1])  # ranks differ element by element
    assert (wide[0] > 0).all()  # 0 is the fill of outputs, so an unwritten output is always wrong


def test_check_values_change_every_iteration() -> None:
    pattern = ValuePattern(2, torch.float32)
    cpu = torch.device("cpu")
    assert not torch.equal(pattern.rank_values(0, 0, 8, 0, cpu), pattern.rank_values(0, 0, 8, 1, cpu))


def test_check_refuses_a_dtype_too_narrow_for_the_world() -> None:
    check_values_exact(torch.int8, 15)  # 15 * 16 / 2 = 120 <= 127
    with pytest.raises(ValueError, match="int8 cannot hold the sum over 16 ranks exactly"):
        check_values_exact(torch.int8, 16)
    with pytest.raises(ValueError, match="--dtype: expected one of"):
        check_values_exact(torch.bool, 2)


def test_options_validate_and_round_trip_through_json() -> None:
    options = BenchOptions(
        backends=("gloo", "ccl"), ops=("all_reduce", "barrier"), min_bytes=8, max_bytes=1024, check=True
    )
    assert BenchOptions.from_json(options.to_json()) == options
    assert options.sizes == [8, 16, 32, 64, 128, 256, 512, 1024]


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"ops": ("all_reduce", "allreduce")}, "--ops: expected a comma-separated subset"),
        ({"backends": ()}, "--backends: expected"),
        ({"dtype": "complex64"}, "--dtype: expected one of"),
        ({"iters": 0}, "--iters/--warmup"),
        ({"repeats": 0}, "--repeats: expected an int >= 1, received 0"),
        ({"min_bytes": 64, "max_bytes": 8}, "size sweep"),
    ],
)
def test_options_reject_bad_values(change: dict, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        BenchOptions(**change)


def _record(backend: str, op: str, nbytes: int, time_us: float, busbw: float, wrong: int = 0) -> BenchRecord:
    return BenchRecord(backend, op, nbytes, nbytes // 4, "float32", 2, time_us, busbw, busbw, wrong)


def test_json_and_csv_have_exactly_the_record_keys(tmp_path) -> None:
    records = [_record("gloo", "all_reduce", 8, 12.5, 0.25), _record("gloo", "barrier", 0, 3.0, 0.0, wrong=3)]
    write_json(tmp_path / "out.json", records)
    rows = json.loads((tmp_path / "out.json").read_text())["records"]
    assert [tuple(row) for row in rows] == [RECORD_KEYS] * 2
    assert RECORD_KEYS == (
        "backend",
        "op",
        "bytes",
        "count",
        "dtype",
        "world_size",
        "time_us",
        "algbw_gbps",
        "busbw_gbps",
        "wrong",
    )
    assert read_json(tmp_path / "out.json") == records
    write_csv(tmp_path / "out.csv", records)
    with open(tmp_path / "out.csv", newline="") as stream:
        table = list(csv.DictReader(stream))
    assert tuple(table[0]) == RECORD_KEYS and table[0]["wrong"] == "0" and table[1]["wrong"] == "3"


def test_side_by_side_ratio_reads_faster_than_the_first_backend() -> None:
    records = [
        _record("gloo", "all_reduce", 1024, 10.0, 2.0),
        _record("mpi", "all_reduce", 1024, 5.0, 4.0),
        _record("gloo", "barrier", 0, 30.0, 0.0),
        _record("mpi", "barrier", 0, 10.0, 0.0),
    ]
    table = format_side_by_side(records).splitlines()
    assert table[1].split() == ["op", "bytes", "gloo", "mpi", "mpi/gloo"]
    assert table[2].split() == ["all_reduce", "1024", "2.000", "4.000", "2.00x"]
    assert table[3].split() == ["barrier", "0", "30.00", "10.00", "3.00x"]  # time ratio, same orientation
    assert format_side_by_side(records[:1]) == ""


def test_report_has_a_table_per_op_and_backend_and_the_notes() -> None:
    records = [
        _record("gloo", "all_reduce", 8, 12.5, 1.5e-5),
        _record("gloo", "all_reduce", 16, 12.0, 3e-5, wrong=2),
    ]
    result = SweepResult(
        tuple(records), ("ccl: skipped (failed to start on ranks [0, 1]): not built",), 2, (("gloo", "cpu"),)
    )
    text = format_report(result, BenchOptions())
    assert (
        "# all_reduce | gloo | 2 ranks | cpu | float32 | 20 iters, 5 warmup | blocking, checked once" in text
    )
    repeated = format_report(result, BenchOptions(repeats=3))
    assert "| 20 iters x 3 repeats (best), 5 warmup |" in repeated
    assert text.splitlines()[1].split() == [
        "bytes",
        "count",
        "dtype",
        "time_us",
        "algbw_GB/s",
        "busbw_GB/s",
        "wrong",
    ]
    assert text.splitlines()[2].split() == ["8", "2", "float32", "12.50", "1.50e-05", "1.50e-05", "0"]
    assert text.splitlines()[3].split()[-1] == "2"
    assert "note: ccl: skipped" in text
    assert SweepResult.from_json(json.loads(json.dumps(result.to_json()))) == result


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"])
def test_check_counts_exactly_the_wrong_elements(op: str, world_of_one: None) -> None:
    """Wiring: a real op on a world of one verifies clean, then every corrupted element is counted."""
    from commlayer import dist
    from commlayer.bench.cases import CaseContext, make_case

    context = CaseContext(None, 0, 1, torch.device("cpu"), torch.float32)
    case = make_case(context, layout(op, 64, torch.float32, 1))
    for iteration in range(3):
        case.fill(iteration)
        case.run_op(async_op=False)
        assert case.wrong(iteration) == 0
    output = case.buffer if hasattr(case, "buffer") else case.output
    output[3:7] += 1
    assert case.wrong(2) == 4
    assert case.wrong(1) == output.numel()  # a stale result from another iteration is all wrong
    assert dist.get_world_size() == 1


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_only(tmp_path) -> None:
    quiet, terminal = io.StringIO(), _Terminal()
    for stream in (quiet, terminal):
        bar = ProgressBar(4, stream)
        bar.update(2, "gloo all_reduce 8B")
        bar.close()
    assert quiet.getvalue() == ""
    assert "gloo all_reduce 8B" in terminal.getvalue() and "2/4" in terminal.getvalue()
    # Under -n, rank 0 appends steps to a file and the parent redraws from its last line.
    writer, shown = StepFileWriter(tmp_path / "steps"), _Terminal()
    writer(1, "gloo broadcast 8B")
    writer(3, "gloo broadcast 64B")
    stop = threading.Event()
    stop.set()  # already done: the follower draws once more, then clears the line
    follow_file(tmp_path / "steps", ProgressBar(4, shown), stop)
    assert "gloo broadcast 64B" in shown.getvalue() and "3/4" in shown.getvalue()
