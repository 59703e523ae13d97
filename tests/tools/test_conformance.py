"""The conformance kit: certificate logic (tier 1), the command's wiring (tier 2), and real runs of
``commlayer test-backend`` on the example plugin and on a deliberately broken one (tier 3)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commlayer.cli import main as commlayer_main
from commlayer.testing.conformance import FAIL, PASS, UNSUPPORTED, Cell, Certificate
from commlayer.testing.conformance.cli import progress_line

REPO = Path(__file__).resolve().parents[2]
DTYPE_COLUMNS = ("float32", "float16")


def _certificate() -> Certificate:
    """Two ranks' verdicts: rank 1 fails all_reduce MAX float32 in the subgroup, async."""
    rank0, rank1 = Certificate("mine", 2), Certificate("mine", 2)
    for certificate, rank in ((rank0, 0), (rank1, 1)):
        for group in ("world", "subgroup"):
            for mode in ("sync", "async"):
                certificate.record(Cell("all_reduce", "MAX", "float32", group, mode), PASS, rank)
                certificate.record(Cell("all_reduce", "MAX", "float16", group, mode), UNSUPPORTED, rank)
                certificate.record(Cell("barrier", "", "", group, mode), PASS, rank)
    rank1.record(Cell("all_reduce", "MAX", "float32", "subgroup", "async"), FAIL, 1, "expected [3], got [1]")
    return Certificate.merge([rank0, rank1])


def test_a_cell_fails_when_any_rank_failed_it() -> None:
    merged = _certificate().merged()
    failed = merged[Cell("all_reduce", "MAX", "float32", "subgroup", "async")]
    assert (failed.status, failed.rank, failed.detail) == (FAIL, 1, "expected [3], got [1]")
    assert merged[Cell("all_reduce", "MAX", "float32", "world", "sync")].status == PASS
    assert _certificate().counts() == {PASS: 7, UNSUPPORTED: 4, FAIL: 1}
    assert not _certificate().passed


def test_the_table_names_each_failure_and_declared_gaps() -> None:
    lines = _certificate().render(DTYPE_COLUMNS).splitlines()
    assert lines[0].split() == ["op", "float32", "float16", "-"]
    assert lines[1].split() == ["all_reduce", "MAX", "FAIL", "n/s"]
    assert lines[2].split() == ["barrier", "pass"]
    assert "FAIL all_reduce MAX float32 subgroup async (rank 1): expected [3], got [1]" in lines
    assert lines[-1].endswith("7 cells passed, 1 failed, 4 declared unsupported -> DOES NOT CONFORM")


def test_certificates_round_trip_through_their_files(tmp_path: Path) -> None:
    original = _certificate()
    original.write(tmp_path / "rank0.certificate.json")
    assert Certificate.read(tmp_path / "rank0.certificate.json") == original


def test_an_unknown_backend_is_reported_before_any_rank_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert commlayer_main(["test-backend", "no-such-backend", "-n", "2"]) == 2
    assert "'no-such-backend' names no installed backend" in capsys.readouterr().err


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/plugin and tests/tools/broken_plugin, installed as distributions into one folder."""
    root = tmp_path_factory.mktemp("plugins")
    site = root / "site"
    for source in (REPO / "examples" / "plugin", REPO / "tests" / "tools" / "broken_plugin"):
        copy = root / source.name  # the build writes next to its sources
        shutil.copytree(source, copy)
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
        subprocess.run([*pip, "--target", str(site), str(copy)], check=True, timeout=240)
    return site


def _commlayer(site: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    command = [sys.executable, "-m", "commlayer", *arguments]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)


def _test_backend(site: Path, name: str, world_size: int) -> subprocess.CompletedProcess[str]:
    return _commlayer(site, "test-backend", name, "-n", str(world_size))


def test_an_installed_plugin_is_listed_with_its_entry_point(plugin_site: Path) -> None:
    listed = _commlayer(plugin_site, "backends").stdout.splitlines()
    assert any(line.split()[:2] == ["storecomm", "available"] for line in listed), listed
    assert any(line.endswith("[commlayer_storecomm:StoreBackend]") for line in listed), listed


@pytest.mark.multirank
def test_the_example_plugin_passes_the_whole_kit(plugin_site: Path) -> None:
    finished = _test_backend(plugin_site, "storecomm", 3)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    rows = {line.split("  ")[0].strip(): line for line in finished.stdout.splitlines()}
    assert rows["all_reduce PRODUCT"].split()[2:4] == ["n/s", "n/s"], rows  # declared unsupported
    assert rows["all_to_all_single"].split()[1:3] == ["pass", "pass"], rows  # a generic fallback
    assert "backend 'storecomm' on 3 ranks" in finished.stdout and "-> CONFORMS" in finished.stdout


@pytest.mark.multirank
def test_a_broken_plugin_fails_with_a_table_naming_what_broke(plugin_site: Path) -> None:
    finished = _test_backend(plugin_site, "brokencomm", 2)
    assert finished.returncode == 1, finished.stdout + finished.stderr
    failures = [line for line in finished.stdout.splitlines() if line.startswith("FAIL ")]
    broken = {" ".join(line.split()[1:4]) for line in failures}
    assert "all_reduce MAX float32" in broken and "broadcast float16 world" in broken, failures
    assert "reduce_scatter_tensor MAX float64" in broken, failures  # the fallback inherits the bug
    assert not any(" SUM " in line or line.startswith("FAIL barrier") for line in failures), failures
    assert "-> DOES NOT CONFORM" in finished.stdout


def test_progress_names_each_ranks_count_and_last_cell(tmp_path: Path) -> None:
    assert progress_line(tmp_path, 3.2) == "[3 s] cells checked: none yet (ranks starting)"
    for rank, cells in ((0, 2), (1, 1)):
        certificate = Certificate("peermem", 2)
        for n in range(cells):
            certificate.record(Cell("all_reduce", "sum", f"float{16 * (n + 1)}"), PASS, rank)
        certificate.write(tmp_path / f"rank{rank}.certificate.json")
    line = progress_line(tmp_path, 20)
    assert line == (
        "[20 s] cells checked: rank0: 2 (last: all_reduce sum float32 world sync), "
        "rank1: 1 (last: all_reduce sum float16 world sync)"
    )


def test_a_per_device_spec_is_certified_like_a_backend() -> None:
    assert commlayer_main(["test-backend", "cpu:gloo", "-n", "2"]) == 0


def test_a_malformed_spec_is_reported_before_any_rank_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert commlayer_main(["test-backend", "cpu:gloo,cpu:shm", "-n", "2"]) == 2
    assert "each device once" in capsys.readouterr().err
