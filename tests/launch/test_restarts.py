"""`commlayer run --max-restarts N`: tier 1 (the restart loop's decisions) and tier 3 (real worlds).

The resume test runs tests/launch/restarts_ranks.py: ZeRO training on gloo where rank 1 dies on
the first start only, and the restarted world resumes from the checkpoint and finishes with the
weights of an uninterrupted run. The exhausted-restarts test uses the torch-free
tests/launch/launcher_ranks.py, so its three worlds start at once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from commlayer import cli
from commlayer.launch import LaunchResult, ProcessOutcome
from commlayer.launch.cli_hosts import with_job_limit
from commlayer.launch.multinode import HostsRun
from commlayer.launch.restarts import Attempt, restart_line, run_with_restarts

REPO = Path(__file__).resolve().parents[2]
RESUMING = str(REPO / "tests" / "launch" / "restarts_ranks.py")
FAILING = str(REPO / "tests" / "launch" / "launcher_ranks.py")

# ---- tier 1: the restart loop -----------------------------------------------------------------


def _result(first_failure: int | None, **fields: object) -> LaunchResult:
    outcomes = (ProcessOutcome("rank 0", 0, False, ()), ProcessOutcome("rank 1", 3, False, ()))
    return LaunchResult(outcomes, first_failure=first_failure, **fields)


def _loop(results: list[LaunchResult], max_restarts: int) -> tuple[list[Attempt], list[int], LaunchResult]:
    attempts: list[Attempt] = []
    told: list[int] = []

    def start(attempt: Attempt) -> LaunchResult:
        attempts.append(attempt)
        return results[attempt.restart]

    last = run_with_restarts(
        start, lambda result: result, max_restarts, None, lambda _, attempt: told.append(attempt.restart)
    )
    return attempts, told, last


def test_a_rank_failure_restarts_until_a_start_succeeds() -> None:
    attempts, told, last = _loop([_result(1), _result(1), _result(None)], max_restarts=5)
    assert [attempt.restart for attempt in attempts] == [0, 1, 2]
    assert told == [0, 1]
    assert last.exit_code == 0


def test_restarts_run_out_and_the_last_failure_is_the_jobs() -> None:
    attempts, told, last = _loop([_result(1)] * 3, max_restarts=2)
    assert ([attempt.restart for attempt in attempts], told) == ([0, 1, 2], [0, 1])
    assert last.exit_code == 3


@pytest.mark.parametrize(
    "ending",
    [{"timed_out": True}, {"signal_received": 15}, {"stop_reason": "the connection closed"}],
    ids=["timeout", "signal", "stop_check"],
)
def test_only_a_rank_failure_restarts(ending: dict[str, object]) -> None:
    attempts, told, _ = _loop([_result(None, **ending)] * 2, max_restarts=3)
    assert (len(attempts), told) == (1, [])


def test_each_attempt_has_torchruns_variables_its_own_job_and_log_folder(tmp_path: Path) -> None:
    first, second = Attempt(0, 2), Attempt(1, 2)
    assert first.environment() == {"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "2"}
    assert second.environment()["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert (first.job_id("job"), second.job_id("job")) == ("job", "job-restart1")
    assert (first.log_dir(tmp_path), second.log_dir(tmp_path)) == (tmp_path, tmp_path / "restart1")
    assert second.log_dir(None) is None
    assert restart_line(_result(1), first) == (
        "commlayer run: restarting every rank (restart 1 of 2) after rank 1 failed"
    )


def test_a_restarted_hosts_timeout_names_the_jobs_limit_not_the_time_left() -> None:
    """An attempt after a restart runs for what is left of --timeout (7 s of 60 here)."""
    timed_out = _result(None, timed_out=True, timeout=7.0)
    outcome = with_job_limit(HostsRun(timed_out, timed_out.summary(), 124), 60.0)
    assert outcome.summary is not None and "timed out after 1 min;" in outcome.summary, outcome.summary
    failed = HostsRun(timed_out, "commlayer run: rank 1 on b failed; stopped every other host", 1)
    assert with_job_limit(failed, 60.0) == failed  # a rank's own report stays the summary


def test_a_negative_max_restarts_is_refused_before_any_start() -> None:
    with pytest.raises(ValueError, match="argument 'max_restarts' expected >= 0, received -1"):
        run_with_restarts(lambda _: pytest.fail("started"), lambda result: result, -1, None, print)
    assert cli.main(["run", "--max-restarts", "-1", FAILING]) == 2


# ---- tier 3: real worlds ----------------------------------------------------------------------


@pytest.mark.multirank
def test_a_rank_dying_once_resumes_from_the_checkpoint_and_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["run", "-n", "2", "--max-restarts", "2", "--log-dir", str(tmp_path / "logs")]
    assert cli.main([*argv, RESUMING, str(tmp_path / "checkpoints"), "4", "2"]) == 0
    out, err = capsys.readouterr()
    starts = re.findall(r"start (\d) of 2: rank (\d) port (\d+) job (\S+) resumes at step (\d)", out)
    assert sorted((start, rank, step) for start, rank, _, _, step in starts) == [
        ("0", "0", "0"),
        ("0", "1", "0"),
        ("1", "0", "2"),
        ("1", "1", "2"),
    ]
    ports = {start: port for start, _, port, _, _ in starts}
    jobs = {start: job for start, _, _, job, _ in starts}
    assert ports["0"] != ports["1"], "the restarted world reused the failed world's store"
    assert jobs["1"] == jobs["0"] + "-restart1"
    for rank in range(2):
        assert f"[rank{rank}] rank {rank} finished 4 steps with the uninterrupted weights" in out
    assert "commlayer run: rank 1 exited with code 3; stopped 1 other rank" in err
    assert "commlayer run: restarting every rank (restart 1 of 2) after rank 1 failed" in err
    assert "restart 2 of 2" not in err
    assert "dies after the checkpoint" in (tmp_path / "logs" / "rank1.log").read_text()
    assert "finished 4 steps" in (tmp_path / "logs" / "restart1" / "rank1.log").read_text()


@pytest.mark.multirank
def test_spent_restarts_end_with_todays_exit_code_and_summary(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "-n", "2", "--max-restarts", "2", FAILING, "--fail-rank", "1", "--exit-code", "3"]
    assert cli.main(argv) == 3
    out, err = capsys.readouterr()
    assert len(set(re.findall(r"MASTER_PORT=(\d+)", out))) == 3, "every start needs its own store port"
    restarts = [line for line in err.splitlines() if "restarting every rank" in line]
    assert restarts == [
        f"commlayer run: restarting every rank (restart {count} of 2) after rank 1 failed" for count in (1, 2)
    ]
    assert err.splitlines()[-1].startswith("commlayer run: rank 1 exited with code 3; ")
