"""``commlayer bench`` end to end. Tier 2: argument handling without communicating. Tier 3: real
2-rank gloo sweeps through ``-n`` and in place under a launcher, with every iteration checked."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commlayer.bench import cli
from commlayer.bench.records import RECORD_KEYS
from commlayer.contract.registry import list_backends
from commlayer.core.metrics import busbw_factor
from commlayer.testing import require_mpirun, run_world
from commlayer.testing.fork_server import warm_command

ALL_OPS = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all,barrier,pingpong"
SIZES = [8, 64, 512, 4096]  # -b 8 -e 4K -f 8; every size holds whole float32 chunks for 2 ranks
SWEEP = ["-b", "8", "-e", "4K", "-f", "8", "--warmup", "1"]  # the sizes above, quickly


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="commlayer bench")
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def _bench(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    # Warm-started (commlayer.testing.fork_server): the parent's torch import is paid once.
    command = warm_command([sys.executable, "-m", "commlayer", "bench", *argv], os.environ)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def _check_records(rows: list[dict] | dict, backend: str, ops: list[str], world_size: int) -> None:
    rows = rows["records"] if isinstance(rows, dict) else rows  # a JSON file: metadata, then records
    assert all(tuple(row) == RECORD_KEYS for row in rows)
    mine = [row for row in rows if row["backend"] == backend]
    expected = [
        (op, 0 if op == "barrier" else size) for op in ops for size in ([0] if op == "barrier" else SIZES)
    ]
    assert [(row["op"], row["bytes"]) for row in mine] == expected
    for row in mine:
        assert row["wrong"] == 0 and row["world_size"] == world_size and row["dtype"] == "float32", row
        assert row["count"] == row["bytes"] // 4 and row["time_us"] > 0
        if row["bytes"]:
            assert row["algbw_gbps"] == pytest.approx(row["bytes"] / row["time_us"] / 1e3)
            assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * busbw_factor(row["op"], world_size))


def test_help_explains_busbw_and_the_deepspeed_difference(capsys: pytest.CaptureFixture[str]) -> None:
    from commlayer.cli import main

    assert main(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    assert "nccl-tests" in text and "DeepSpeed" in text and "2S/t" in text and "--min-bytes" in text


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--ops", "all_reduce,allgather"], "--ops: expected a comma-separated subset"),
        (["-b", "1M", "-e", "8"], "size sweep: expected 1 <= min-bytes <= max-bytes"),
        (["-n", "2", "--backends", "mpi"], "needs ranks started by mpirun, which -n does not use"),
        (["-n", "16", "--dtype", "int8"], "--dtype: torch.int8 cannot hold the sum over 16 ranks exactly"),
    ],
)
def test_bad_requests_fail_before_any_rank_starts(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(_parse(*argv)) == 2
    assert complaint in capsys.readouterr().err


def test_dash_n_is_refused_under_another_launcher(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(_parse("-n", "2")) == 2
    assert "under torchrun, mpirun or srun leave it out" in capsys.readouterr().err


@pytest.mark.multirank
def test_two_rank_gloo_sweep_writes_table_json_csv_and_png(tmp_path: Path) -> None:
    outputs = {kind: tmp_path / f"out.{kind}" for kind in ("json", "csv", "png")}
    done = _bench(
        "-n",
        "2",
        "--backends",
        "gloo,nosuch",
        "--ops",
        ALL_OPS,
        *SWEEP,
        "--iters",
        "3",
        "--check",
        "--json",
        str(outputs["json"]),
        "--csv",
        str(outputs["csv"]),
        "--plot",
        str(outputs["png"]),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for op in ALL_OPS.split(","):
        assert (
            f"# {op} | gloo | 2 ranks | cpu | float32 | 3 iters, 1 warmup | blocking, every iteration checked"
            in done.stdout
        )
    headers = [line.split() for line in done.stdout.splitlines() if line.strip().startswith("bytes")]
    assert headers == [["bytes", "count", "dtype", "time_us", "algbw_GB/s", "busbw_GB/s", "wrong"]] * 7
    assert (
        "note: nosuch: skipped (failed to start on ranks [0, 1]): BackendUnavailableError: backend 'nosuch' names no installed backend"
        in done.stdout
    )
    _check_records(json.loads(outputs["json"].read_text()), "gloo", ALL_OPS.split(","), 2)
    assert outputs["csv"].read_text().splitlines()[0] == ",".join(RECORD_KEYS)
    assert len(outputs["csv"].read_text().splitlines()) == 1 + 6 * len(SIZES) + 1
    _check_png(outputs["png"])


@pytest.mark.multirank
def test_in_place_under_a_launcher_with_async_ops(tmp_path: Path) -> None:
    """Every rank runs `commlayer bench` itself (as under torchrun); rank 0 alone writes."""
    target = tmp_path / "records.json"
    run_world(
        "tests.tools.bench_cli_ranks:run",
        2,
        backend=None,
        timeout=180,
        args=[
            str(target),
            "--backends",
            "gloo",
            "--ops",
            "all_reduce,all_gather,reduce_scatter",
            "--async",
            "--check",
            *SWEEP,
            "--iters",
            "3",
        ],
    )
    _check_records(json.loads(target.read_text()), "gloo", ["all_reduce", "all_gather", "reduce_scatter"], 2)


@pytest.mark.multirank
@pytest.mark.ccl
def test_backends_side_by_side(tmp_path: Path) -> None:
    if not any(info.name == "ccl" and info.availability for info in list_backends()):
        pytest.skip("the ccl backend is not available here")
    done = _bench(
        "-n",
        "2",
        "--backends",
        "gloo,ccl",
        "--ops",
        "all_reduce,barrier",
        *SWEEP,
        "--iters",
        "2",
        "--json",
        str(tmp_path / "out.json"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "out.json").read_text())["records"]
    for backend in ("gloo", "ccl"):
        _check_records(rows, backend, ["all_reduce", "barrier"], 2)
    # The table, without the "wrote FILE" lines that follow it.
    summary = [
        line for line in done.stdout.split("# side by side")[1].splitlines() if not line.startswith("wrote ")
    ]
    assert summary[1].split() == ["op", "bytes", "gloo", "ccl", "ccl/gloo"]
    assert [line.split()[:2] for line in summary[2:]] == [["all_reduce", str(size)] for size in SIZES] + [
        ["barrier", "0"]
    ]


@pytest.mark.multirank
@pytest.mark.mpi
def test_mpi_next_to_gloo_under_mpirun(tmp_path: Path) -> None:
    """mpi needs mpirun; under it the same command compares mpi with gloo (discovered over MPI)."""
    options = ["--backends", "gloo,mpi", "--ops", "all_reduce,all_to_all,pingpong", "-b", "8", "-e"]
    options += ["4K", "-f", "8", "--iters", "2", "--warmup", "1", "--repeats", "2"]
    rows = _records_under_mpirun(tmp_path, options)
    for backend in ("gloo", "mpi"):
        _check_records(rows, backend, ["all_reduce", "all_to_all", "pingpong"], 2)


def _records_under_mpirun(tmp_path: Path, options: list[str]) -> list[dict]:
    """The records of one `commlayer bench` run on 2 ranks under mpirun."""
    require_mpirun()
    target = tmp_path / "records.json"
    run_world(
        "tests.tools.bench_cli_ranks:run",
        2,
        backend=None,
        launcher="mpirun",
        timeout=180,
        args=[str(target), *options],
    )
    return json.loads(target.read_text())["records"]


def _check_png(path: Path) -> None:
    from matplotlib import image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100


@pytest.mark.multirank
@pytest.mark.mpi
def test_window_put_get_on_shm_and_mpi_against_raw_mpi_rma(tmp_path: Path) -> None:
    """One run times put and get on shm's and mpi's windows and on a raw mpi4py RMA window, the
    three taking turns at each size (--interleave); each op's rows still come backend by backend."""
    options = ["--backends", "shm,mpi,mpi4py", "--ops", "put,get", "-b", "8", "-e", "4K", "-f", "8"]
    options += ["--iters", "2", "--warmup", "1", "--repeats", "2", "--check", "--interleave"]
    rows = _records_under_mpirun(tmp_path, options)
    for backend in ("shm", "mpi", "mpi4py"):
        _check_records(rows, backend, ["put", "get"], 2)
    order = [(row["op"], row["backend"]) for row in rows]
    assert order == [
        (op, backend) for op in ("put", "get") for backend in ("shm", "mpi", "mpi4py") for _ in range(4)
    ]
