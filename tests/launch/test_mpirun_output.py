"""Pure logic of what ``commlayer run`` prints: mpirun's labelled lines split back into ranks
(Intel MPI's and Open MPI's labels, their MPI_Abort notices, their reports of a dead rank), the
200-character summary, and the check of the backend choice before any rank starts."""

from __future__ import annotations

from pathlib import Path

from commlayer.launch.backend_check import backend_names, check_backend
from commlayer.launch.mpirun_local import RankLines, rank_results
from commlayer.launch.report import SUMMARY_LIMIT, final_report, fit_summary
from commlayer.launch.supervise import LaunchResult, ProcessOutcome

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "typo.py", line 6, in <module>',
    "    dist.all_reduce(t, op=dist.ReduceOp.SUMM)",
    "AttributeError: SUMM. Did you mean: 'SUM'?",
]
OPEN_MPI_ABORT_BOX = [
    "-" * 74,
    "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD",
    "  Proc: [[9662,1],1]",
    "  Errorcode: 1",
    "",
    "NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.",
    "-" * 74,
]


def feed_all(lines: RankLines, labelled: list[tuple[str, bool]]) -> list[str]:
    echoed = [line for text, stderr in labelled for line in lines.feed(text, stderr)]
    return echoed + lines.flush(stderr=True)


def mpirun_result(code: int) -> LaunchResult:
    outcome = ProcessOutcome("mpirun", code, stopped=False, output_tail=())
    return LaunchResult((outcome,), first_failure=0 if code else None)


def test_hydra_labels_become_rank_tags_and_the_abort_notice_goes(tmp_path: Path) -> None:
    lines = RankLines(2, tmp_path)
    labelled = [("[0] step 1", False), *((f"[1] {text}", True) for text in TRACEBACK)]
    labelled += [
        ("[1] Abort(1) on node 1 (rank 1 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 1)", True)
    ]
    labelled += [
        ("===================", False),
        ("=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES", False),
    ]
    assert feed_all(lines, labelled) == ["[rank0] step 1"]  # the traceback is held, the rest dropped
    lines.close()
    assert lines.ranks[1].hold.lines == TRACEBACK
    assert lines.ranks[1].hold.exception == "AttributeError: SUMM. Did you mean: 'SUM'?"
    assert (tmp_path / "rank1.log").read_text().splitlines()[-1].startswith("Abort(1) on node 1")
    assert (tmp_path / "rank0.log").read_text() == "step 1\n"


def test_open_mpi_tags_name_the_stream_and_its_abort_box_goes_even_before_the_traceback() -> None:
    lines = RankLines(2, None)
    labelled = [(f"[1,1]<stderr>: {text}", False) for text in OPEN_MPI_ABORT_BOX]
    labelled += [
        ("[1,1]<stderr>: \0commlayer: flight recorder of rank 1 dumped to x (peer rank 0 failed)", False)
    ]
    labelled += [(f"[1,1]<stderr>: {text}", False) for text in TRACEBACK]
    labelled += [("[1,0]<stdout>: ready", True)]
    echoed = feed_all(lines, labelled)
    assert echoed == [
        "[rank1] commlayer: flight recorder of rank 1 dumped to x (peer rank 0 failed)",
        "[rank0] ready",
    ]
    assert lines.ranks[1].hold.lines == TRACEBACK


def test_the_first_rank_to_raise_is_the_failure_with_mpiruns_exit_code() -> None:
    lines = RankLines(3, None)
    feed_all(lines, [(f"[2] {text}", True) for text in TRACEBACK])
    feed_all(lines, [("[0] ValueError: later", True)])
    result = rank_results(mpirun_result(1), lines)
    assert result.first_failure == 2 and result.exit_code == 1
    assert [outcome.stopped for outcome in result.outcomes] == [True, True, False]
    assert result.summary() == (
        "commlayer run: rank 2 raised AttributeError: SUMM. Did you mean: 'SUM'? and exited with code 1; "
        "stopped 2 other ranks"
    )


def test_a_rank_that_mpirun_saw_die_comes_before_its_peers_errors() -> None:
    lines = RankLines(2, None)
    feed_all(lines, [("[1,0]<stderr>: PeerFailureError: peer rank 1 failed", False)])
    wrapped = ["prterun noticed that process rank 1 with PID 42 on node vm exited on", "signal 9 (Killed)."]
    feed_all(lines, [(text, True) for text in wrapped])
    result = rank_results(mpirun_result(137), lines)
    assert result.first_failure == 1 and result.exit_code == 137
    assert result.summary().startswith("commlayer run: rank 1 was killed by SIGKILL (exit code 137)")


def test_hydra_boxes_that_do_not_tell_the_first_death_are_reported_as_they_are() -> None:
    lines = RankLines(2, None)
    boxes = [
        line
        for rank in (0, 1)
        for line in (f"=   RANK {rank} PID {40 + rank} RUNNING AT vm", "=   KILLED BY SIGNAL: 9 (Killed)")
    ]
    feed_all(lines, [(line, False) for line in boxes])
    result = rank_results(mpirun_result(255), lines)
    assert result.first_failure is None
    assert result.summary() == (
        "commlayer run: mpirun exited with code 255 and saw ranks 0, 1 killed by SIGKILL (not which first); "
        "stopped nothing"
    )


def test_a_long_summary_cuts_the_exception_only() -> None:
    exception = "CommTimeoutError: " + "all_reduce on group 'world' did not complete " * 8
    outcome = ProcessOutcome(
        "rank 2", 1, False, (), ("Traceback (most recent call last):", exception), exception
    )
    result = LaunchResult((outcome,), first_failure=0)
    summary = final_report(result, Path("/tmp/commlayer-run/20261127-065012-4242"))[-1]
    assert len(summary) == SUMMARY_LIMIT, summary
    assert summary.startswith("commlayer run: rank 2 raised CommTimeoutError: all_reduce on group")
    assert "... and exited with code 1; stopped no other rank; every rank's output is in /tmp/" in summary
    assert fit_summary("commlayer run: timed out after 5 s; stopped rank 0") == (
        "commlayer run: timed out after 5 s; stopped rank 0"
    )


def test_the_backend_choice_is_checked_by_name_and_on_this_host() -> None:
    assert backend_names("cpu:gloo, cuda:NCCL") == ["gloo", "nccl"]
    assert check_backend("gloo", "--backend") is None
    unknown = check_backend("glo", "--backend", availability=False)
    assert unknown is not None and unknown.startswith(
        "--backend 'glo' names no installed backend (did you mean 'gloo'?)"
    )
    assert check_backend("cpu:gloo,cuda:nope", "$COMMLAYER_BACKEND") is not None
    assert check_backend("hccl", "--backend", availability=False) is None  # installed, not checked here
    unavailable = check_backend("hccl", "--backend")
    assert unavailable is not None and unavailable.startswith("--backend 'hccl' cannot run on this host: ")
    assert "\n" not in unavailable
