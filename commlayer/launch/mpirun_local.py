"""``commlayer run -n N`` through mpirun (the mpi backend's ranks): output exactly as a local run's.

One mpirun starts this host's ranks and labels each rank's lines: Intel MPI's ``-l`` (whole lines
with ``-ordered-output``), Open MPI's ``--tag-output``. :class:`RankLines` reads the labels back
into one stream per rank: the ``[rankN]`` echo, ``DIR/rankN.log`` and the rank's held traceback;
mpirun's own messages (the "BAD TERMINATION" boxes) go only to ``DIR/mpirun.log``. The ranks'
outcomes then make the same report as a local run (:func:`~.report.final_report`)::

    [rank1] Traceback (most recent call last):
    [rank1]   ...
    [rank1] AttributeError: SUMM. Did you mean: 'SUM'?
    commlayer run: rank 1 raised AttributeError: SUMM. Did you mean: 'SUM'? and exited with code 1;
    stopped 1 other rank; every rank's output is in /tmp/commlayer-run/<job>/rank<N>.log

mpirun reports one exit code for the job: the rank that raised first is named with it, and every
other rank counts as stopped (mpirun ends them when one fails).
"""

from __future__ import annotations

import re
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from commlayer.core.errors import describe_ranks
from commlayer.core.job import JOB_ID_ENV
from commlayer.launch.report import default_log_dir, final_report, prune_run_logs
from commlayer.launch.restarts import Attempt, restart_line, run_with_restarts
from commlayer.launch.supervise import LaunchResult, ProcessOutcome, ProcessSpec, SuperviseOptions, supervise
from commlayer.launch.tracebacks import TracebackHold, strip_torch_prefix

__all__ = ["MpirunJob", "RankLines", "rank_results", "run_ranks_under_mpirun"]

# "[1] text" (Hydra's -l), "[1,0]<stderr>: text" or "[1,0]<stderr>:text" (Open MPI's --tag-output).
_LABEL = re.compile(r"\[(?:\d+,)?(?P<rank>\d+)\](?:<(?P<stream>stdout|stderr)>:)? ?(?P<text>.*)")
# How mpirun names a rank that died without a traceback. Hydra: a box with "RANK 1 PID 42 RUNNING
# AT host", then "KILLED BY SIGNAL: 9 (Killed)" or "EXIT CODE: 1"; Open MPI: "... process rank 1
# with PID 42 on node host exited on signal 9 (Killed)".
_HYDRA_RANK = re.compile(r"=\s+RANK (?P<rank>\d+) PID \d+ RUNNING AT")
_HYDRA_END = re.compile(r"=\s+(?:KILLED BY SIGNAL: (?P<signal>\d+)|EXIT CODE: (?P<code>\d+))")
_OPENMPI_DEATH = re.compile(
    r"process rank (?P<rank>\d+) with PID \d+ on node \S+ exited on\s+signal (?P<signal>\d+)"
)
# The MPI library's notice of the MPI_Abort that ends a rank after an uncaught exception (the mpi
# backend aborts at exit rather than hang in MPI_Finalize): Intel MPI's line, Open MPI's box.
_INTEL_ABORT = re.compile(r"Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): .*MPI_Abort")
_RULE = re.compile(r"-{20,}")
_TAIL_LINES = 40
_MESSAGES_KEPT = 200
# How mpirun ends the other ranks once one failed: a rank that died so was not the first.
_CLEANUP_CODES = frozenset({-signal.SIGKILL, -signal.SIGTERM})


class _AbortNotice:
    """Drops the MPI_Abort notice from a rank's echo and held lines (its log keeps it): it says
    how the job ended, which the summary says better. Open MPI's box may come before the
    rank's traceback (its launcher prints it)."""

    def __init__(self) -> None:
        self.box: list[str] | None = None
        self.dropped = False

    def feed(self, text: str) -> list[str]:
        if self.box is not None:
            self.box.append(text)
            if len(self.box) == 2 and "MPI_ABORT" not in text:
                return self.flush()
            if len(self.box) > 2 and _RULE.fullmatch(text):
                self.box, self.dropped = None, True
            return []
        if _INTEL_ABORT.search(text):
            self.dropped = True
            return []
        if _RULE.fullmatch(text):
            self.box = [text]
            return []
        return [] if self.dropped and not text.strip() else [text]

    def flush(self) -> list[str]:
        box, self.box = self.box or [], None
        return box


@dataclass
class _Rank:
    hold: TracebackHold = field(default_factory=TracebackHold)
    abort_notice: _AbortNotice = field(default_factory=_AbortNotice)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))
    log: TextIO | None = None
    raised_at: float | None = None  # time.monotonic() when its first exception was seen


class RankLines:
    """A :class:`~.supervise.LineRouter` for one mpirun of ``world_size`` ranks, logging each
    rank's lines to ``log_dir/rank<N>.log`` (when given)."""

    def __init__(self, world_size: int, log_dir: Path | None) -> None:
        self.world_size = world_size
        self.log_dir = log_dir
        self.ranks: dict[int, _Rank] = {}
        self.messages: deque[str] = deque(maxlen=_MESSAGES_KEPT)  # mpirun's own lines
        self._lock = threading.Lock()

    def feed(self, line: str, stderr: bool) -> list[str]:
        match = _LABEL.fullmatch(line)
        if match is None or int(match["rank"]) >= self.world_size:
            self.messages.append(line)  # mpirun's own message: in its log, not echoed
            return []
        # Open MPI ends a notice of its own with a NUL, which the rank's next line then starts with.
        rank, text = int(match["rank"]), strip_torch_prefix(match["text"].replace("\0", ""))
        stderr = match["stream"] == "stderr" if match["stream"] else stderr
        with self._lock:
            state = self._rank(rank)
            state.tail.append(text)
            if state.log is not None:
                state.log.write(text + "\n")
                state.log.flush()
            echoed = []
            for kept in state.abort_notice.feed(text):
                echoed += state.hold.feed(kept) if stderr else [kept]
            if state.hold.exception is not None and state.raised_at is None:
                state.raised_at = time.monotonic()
        return [f"[rank{rank}] {text}" for text in echoed]

    def flush(self, stderr: bool) -> list[str]:
        if not stderr:
            return []
        with self._lock:
            flushed = []
            for rank, state in sorted(self.ranks.items()):
                kept = [line for text in state.abort_notice.flush() for line in state.hold.feed(text)]
                flushed += [f"[rank{rank}] {text}" for text in [*kept, *state.hold.flush()]]
            return flushed

    def close(self) -> None:
        with self._lock:
            for state in self.ranks.values():
                if state.log is not None:
                    state.log.close()

    def deaths(self) -> dict[int, int]:
        """The ranks mpirun reports dead, with their exit codes (negative: a signal). Open MPI
        names only the first; Hydra lists every rank it saw end, the ones it killed too."""
        messages = list(self.messages)
        if (match := _OPENMPI_DEATH.search(" ".join(messages))) is not None:  # a wrapped message
            return {int(match["rank"]): -int(match["signal"])}
        found: dict[int, int] = {}
        rank = None
        for line in messages:
            if (match := _HYDRA_RANK.search(line)) is not None:
                rank = int(match["rank"])
            elif rank is not None and (match := _HYDRA_END.search(line)) is not None:
                found[rank] = -int(match["signal"]) if match["signal"] else int(match["code"])
                rank = None
        return found

    def _rank(self, rank: int) -> _Rank:
        if rank not in self.ranks:
            log = None
            if self.log_dir is not None:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                log = open(self.log_dir / f"rank{rank}.log", "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
            self.ranks[rank] = _Rank(log=log)
        return self.ranks[rank]


def rank_results(mpirun: LaunchResult, lines: RankLines) -> LaunchResult:
    """The ranks' outcomes within ``mpirun``'s. When the job failed by itself, the rank that
    raised first (else the one mpirun reports dead) is the failure, with mpirun's exit code, and
    every other rank was stopped by mpirun."""
    ended = mpirun.first_failure is not None  # mpirun exited non-zero by itself
    first, code = _first_failure(lines, mpirun.outcomes[0].exit_code) if ended else (None, 0)
    reported = lines.deaths() if ended and first is None else {}
    outcomes = []
    for rank in range(lines.world_size):
        state = lines.ranks.get(rank) or _Rank()
        raised_code = 1 if state.raised_at is not None else 0
        outcomes.append(
            ProcessOutcome(
                f"rank {rank}",
                code if rank == first else raised_code,
                (ended and rank != first and rank not in reported) or mpirun.outcomes[0].stopped,
                tuple(state.tail),
                tuple(state.hold.lines),
                state.hold.exception,
            )
        )
    stop_reason = mpirun.stop_reason
    if ended and first is None:
        stop_reason = f"mpirun exited with code {mpirun.exit_code} {_described_deaths(reported)}"
    return replace(mpirun, outcomes=tuple(outcomes), first_failure=first, stop_reason=stop_reason)


def _first_failure(lines: RankLines, mpirun_code: int) -> tuple[int | None, int]:
    """The rank that failed first: one that mpirun saw die without a traceback (its peers' errors
    follow from it) when mpirun names one alone, else the first to raise (with mpirun's code)."""
    raised = {rank: state.raised_at for rank, state in lines.ranks.items() if state.raised_at is not None}
    silent = {rank: code for rank, code in lines.deaths().items() if rank not in raised}
    causes = {rank: code for rank, code in silent.items() if code not in _CLEANUP_CODES} or silent
    if len(causes) == 1:
        return next(iter(causes.items()))
    if raised:
        return min(raised, key=lambda rank: raised[rank]), mpirun_code
    return None, 0


def _described_deaths(deaths: dict[int, int]) -> str:
    if not deaths:
        return "and named no failed rank (see mpirun.log)"
    by_exit: dict[int, list[int]] = {}
    for rank, code in sorted(deaths.items()):
        by_exit.setdefault(code, []).append(rank)
    listing = ", ".join(f"{describe_ranks(ranks)} {_exit_words(code)}" for code, ranks in by_exit.items())
    return f"and saw {listing} (not which first)"


def _exit_words(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


@dataclass(frozen=True)
class MpirunJob:
    """What :func:`run_ranks_under_mpirun` starts: ``argv`` (mpirun and the rank program) for
    ``world_size`` ranks with mpirun's environment ``env``; ``job_id`` names the logs and dumps,
    and ``log_dir`` is ``--log-dir`` (None: ``<tmp>/commlayer-run/<job id>``)."""

    argv: tuple[str, ...]
    world_size: int
    env: Mapping[str, str]
    job_id: str
    log_dir: Path | None = None


def run_ranks_under_mpirun(job: MpirunJob, max_restarts: int, timeout: float | None) -> int:
    """Run ``job`` (again after a rank failed, up to ``max_restarts`` times); print the report
    as a local run does and return the job's exit status."""

    def start(attempt: Attempt) -> tuple[LaunchResult, Path]:
        job_id = attempt.job_id(job.job_id)
        log_dir = attempt.log_dir(job.log_dir) or prune_run_logs(default_log_dir(job_id))
        lines = RankLines(job.world_size, log_dir)
        # mpirun passes its environment to its ranks.
        env = {**job.env, JOB_ID_ENV: job_id, **attempt.environment()}
        spec = ProcessSpec("mpirun", job.argv, env, tag="", router=lines)
        try:
            result = supervise([spec], SuperviseOptions(timeout=attempt.timeout, log_dir=log_dir))
        finally:
            lines.close()
        return rank_results(result, lines), log_dir

    def report(run: tuple[LaunchResult, Path], attempt: Attempt | None = None) -> None:
        result, log_dir = run
        printed = final_report(replace(result, timeout=timeout), log_dir)
        for line in [*printed, *([restart_line(result, attempt)] if attempt is not None else [])]:
            print(line, file=sys.stderr, flush=True)

    last = run_with_restarts(start, lambda run: run[0], max_restarts, timeout, report)
    report(last)
    return last[0].exit_code
