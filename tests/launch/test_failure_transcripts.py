"""A failed ``commlayer run`` fits on one screen: one full traceback, one line per other rank,
one prefix per line, one flight-recorder notice per rank, durations as people write them, and a
summary of at most 200 characters. Under mpirun (the mpi backend) it prints the same; a backend
that cannot run is refused in one line before any rank starts; an argument refused before any
communication writes no dump.

Each test runs the real launcher on real ranks (shm, the CPU default, unless it names another)
and counts the lines it printed; the rank programs are in failure_transcripts_ranks.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commlayer.contract.registry import list_backends
from commlayer.testing.mpi import mpirun_unavailable_reason

pytestmark = pytest.mark.multirank

ROOT = Path(__file__).resolve().parents[2]
RANKS = Path(__file__).with_name("failure_transcripts_ranks.py")
_TAG = re.compile(r"^\[rank(\d+)\] ")
_DEFAULT_LOG_DIR = "/tmp/commlayer-run/20261127-065012-4242"
_AVAILABLE = {info.name for info in list_backends() if info.availability}


def run_scenario(
    scenario: str, ranks: int, tmp_path: Path, *options: str, **variables: str
) -> tuple[list[str], int]:
    """``commlayer run -n RANKS [OPTIONS] failure_transcripts_ranks.py SCENARIO`` with ``variables``
    set: its output lines and exit code."""
    env = {
        key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "MASTER_PORT")
    }
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])),
        COMMLAYER_TRACE_DIR=str(tmp_path / "trace"),
        **variables,
    )
    env.pop("COMMLAYER_DEBUG", None)
    argv = [sys.executable, "-m", "commlayer", "run", "-n", str(ranks), "--log-dir", str(tmp_path / "logs")]
    argv += options
    done = subprocess.run(
        [*argv, str(RANKS), scenario], capture_output=True, text=True, timeout=180, env=env, check=False
    )
    return (done.stdout + done.stderr).splitlines(), done.returncode


def rank_lines(lines: list[str], rank: int, containing: str) -> list[str]:
    return [line for line in lines if line.startswith(f"[rank{rank}] ") and containing in line]


def full_traceback(lines: list[str]) -> list[str]:
    """The one full traceback: from its first line to its rank's exception line."""
    start = next(
        index for index, line in enumerate(lines) if line.endswith("Traceback (most recent call last):")
    )
    tag = _TAG.match(lines[start]).group(0)
    for end in range(start + 1, len(lines)):
        body = lines[end][len(tag) :]
        if lines[end].startswith(tag) and body[:1].isalpha():
            return lines[start : end + 1]
    raise AssertionError("the traceback has no exception line:\n" + "\n".join(lines))


def check_common(lines: list[str], tmp_path: Path) -> None:
    transcript = "\n".join(lines)
    assert not [line for line in lines if re.match(r"^\[rank\d+\] \[rank\d+\]", line)], transcript
    assert not [line for line in lines if re.match(r"^\[rank\d+\] frame #\d+", line)], transcript
    assert "3.000000" not in transcript and "_C.Shm" not in transcript, transcript
    for rank in range(8):
        assert len(rank_lines(lines, rank, "flight recorder of rank")) <= 1, transcript
    # At most 200 characters with the default log folder (the test's own is longer).
    assert len(lines[-1].replace(str(tmp_path / "logs"), _DEFAULT_LOG_DIR)) <= 200, lines[-1]


def check_typo(lines: list[str], code: int, tmp_path: Path) -> int:
    """The typo scenario's common shape: one full traceback, the summary naming the rank that
    printed it and the log folder, that rank's log; returns the rank."""
    transcript = "\n".join(lines)
    assert code == 1, transcript
    check_common(lines, tmp_path)
    traceback = full_traceback(lines)
    assert sum("Traceback (most recent call last)" in line for line in lines) == 1, transcript
    assert traceback[-1].endswith("AttributeError: SUMM. Did you mean: 'SUM'?"), transcript
    failed = int(_TAG.match(traceback[0]).group(1))
    # The exception may be cut short to fit this test's long log folder.
    assert lines[-1].startswith(f"commlayer run: rank {failed} raised AttributeError: SUMM"), transcript
    assert lines[-1].endswith(f"; every rank's output is in {tmp_path / 'logs'}/rank<N>.log"), transcript
    log = (tmp_path / "logs" / f"rank{failed}.log").read_text()
    assert "Traceback (most recent call last)" in log and "AttributeError: SUMM" in log, log
    return failed


def test_a_typo_on_four_ranks_prints_one_traceback_and_a_line_per_other_rank(tmp_path: Path) -> None:
    lines, code = run_scenario("typo", 4, tmp_path)
    check_typo(lines, code, tmp_path)
    transcript = "\n".join(lines)
    assert len(lines) - len(full_traceback(lines)) <= 15, transcript
    for rank in range(4):
        assert len(rank_lines(lines, rank, "AttributeError: SUMM")) == 1, transcript
        log = (tmp_path / "logs" / f"rank{rank}.log").read_text()
        assert "Traceback (most recent call last)" in log and "AttributeError: SUMM" in log, log


def test_a_timeout_prints_one_typed_line_per_waiting_rank(tmp_path: Path) -> None:
    lines, code = run_scenario("timeout", 3, tmp_path)
    transcript = "\n".join(lines)
    assert code == 1, transcript
    check_common(lines, tmp_path)
    for rank in (0, 2):  # rank 1 is stuck in computation and never enters the all_reduce
        typed = rank_lines(lines, rank, "CommTimeoutError: ")
        assert len(typed) == 1, transcript
        assert "timeout of 3 s" in typed[0], transcript
    assert not [line for line in lines if "TCPStore" in line and "Exception raised from" in line], transcript


def test_survivors_of_a_dead_peer_print_one_typed_line_each(tmp_path: Path) -> None:
    lines, code = run_scenario("dead-peer", 3, tmp_path)
    transcript = "\n".join(lines)
    assert code == 3, transcript
    check_common(lines, tmp_path)
    assert "Traceback (most recent call last)" not in transcript, transcript  # the dead rank raised nothing
    for rank in (0, 2):
        assert len(rank_lines(lines, rank, "PeerFailureError: ")) == 1, transcript
    assert lines[-1].startswith("commlayer run: rank 1 exited with code 3"), transcript


@pytest.mark.mpi
@pytest.mark.parametrize("mpi", ["intel-mpi", "openmpi"])
def test_a_typo_under_mpirun_prints_what_a_local_run_prints(mpi: str, tmp_path: Path) -> None:
    reason = mpirun_unavailable_reason({**os.environ, "COMMLAYER_MPI": mpi})
    if reason is not None:
        pytest.skip(f"mpirun with {mpi} unavailable: {reason}")
    lines, code = run_scenario("typo", 2, tmp_path, COMMLAYER_BACKEND="mpi", COMMLAYER_MPI=mpi)
    check_typo(lines, code, tmp_path)
    transcript = "\n".join(lines)
    # mpirun's own labels and notices are gone: every line but the summary is a rank's.
    assert all(_TAG.match(line) for line in lines[:-1]), transcript
    assert "MPI_ABORT" not in transcript and "MPI_Abort" not in transcript, transcript
    assert " and exited with code 1; stopped 1 other rank; " in lines[-1], transcript


def test_an_argument_refused_before_communicating_writes_no_dump(tmp_path: Path) -> None:
    lines, code = run_scenario("bad-argument", 2, tmp_path)
    transcript = "\n".join(lines)
    assert code == 1, transcript
    check_common(lines, tmp_path)
    assert "raised InvalidArgumentError: " in lines[-1], transcript
    assert "flight recorder" not in transcript and not (tmp_path / "trace").exists(), transcript


def test_a_backend_that_cannot_run_is_refused_in_one_line_before_any_rank_starts(tmp_path: Path) -> None:
    lines, code = run_scenario("typo", 2, tmp_path, "--backend", "glo")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(
        "commlayer run: --backend 'glo' names no installed backend (did you mean 'gloo'?)"
    )
    assert not (tmp_path / "logs").exists()
    if "nccl" not in _AVAILABLE:
        lines, code = run_scenario("typo", 2, tmp_path, COMMLAYER_BACKEND="nccl")
        assert code == 2 and len(lines) == 1, lines
        assert lines[0].startswith("commlayer run: $COMMLAYER_BACKEND 'nccl' cannot run on this host: "), (
            lines
        )
        assert not (tmp_path / "logs").exists()
