"""What ``commlayer run`` prints after its world ended: a failure on one screen.

The supervisor held every rank's traceback (:mod:`.tracebacks`). For a failed world this prints
the first failing rank's held output in full, one line for every other rank that raised (its
exception), and the summary naming the first failing rank, its exception and where every rank's
full output is::

    [rank2] Traceback (most recent call last):
    [rank2]   ...
    [rank2] AttributeError: SUMM. Did you mean: 'SUM'?
    [rank0] AttributeError: SUMM. Did you mean: 'SUM'?
    [rank1] AttributeError: SUMM. Did you mean: 'SUM'?
    commlayer run: rank 2 raised AttributeError: SUMM. Did you mean: 'SUM'? and exited with code 1;
    stopped 0 other ranks; every rank's output is in /tmp/commlayer-run/<job>/rank<N>.log

(the summary is one line, of at most :data:`SUMMARY_LIMIT` characters: a long exception is cut
short there, since it is printed in full above it).

A world that succeeded shows each held traceback in full (the ranks caught and went on).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from commlayer.core.job import keep_jobs, prune_job_folders
from commlayer.launch.supervise import LaunchResult, ProcessOutcome

__all__ = ["SUMMARY_LIMIT", "default_log_dir", "final_report", "fit_summary", "prune_run_logs"]

SUMMARY_LIMIT = 200
# "... rank 2 raised <exception> and exited with code 1; ...": the exception is what may be cut.
_RAISED = re.compile(
    r"(?P<head>.*? raised )(?P<exception>.*)(?P<tail> and (?:exited with code|was killed by) .*)"
)
_SHORTEST_EXCEPTION = 24


def default_log_dir(job: str) -> Path:
    """``<tmp>/commlayer-run/<job>``: where ``commlayer run`` keeps the ranks' output by default."""
    return Path(tempfile.gettempdir()) / "commlayer-run" / job


def prune_run_logs(log_dir: Path) -> Path:
    """``log_dir`` (a new job's default one), after removing the oldest job folders beside it
    beyond ``$COMMLAYER_KEEP_JOBS``."""
    prune_job_folders(log_dir.parent, keep_jobs(), _is_run_log_folder, spare=log_dir)
    return log_dir


def _is_run_log_folder(folder: Path) -> bool:
    return all(child.suffix == ".log" and child.is_file() for child in folder.iterdir())


def final_report(result: LaunchResult, log_dir: Path | None, prefix: str = "commlayer run") -> list[str]:
    """The lines to print once the world ended (none for a quiet success)."""
    first = result.first_failure
    lines: list[str] = []
    if first is not None:
        lines += [_tag(result.outcomes[first]) + line for line in result.outcomes[first].held]
    for index, outcome in enumerate(result.outcomes):
        if not outcome.held or index == first:
            continue
        if first is None:
            lines += [_tag(outcome) + line for line in outcome.held]
        else:
            lines.append(_tag(outcome) + (outcome.exception or "(a traceback; see its log)"))
    summary = result.summary(prefix)
    if summary is not None:
        where = f"; every rank's output is in {log_dir}/rank<N>.log" if log_dir is not None else ""
        lines.append(fit_summary(summary + where))
    return lines


def fit_summary(line: str, limit: int = SUMMARY_LIMIT) -> str:
    """``line`` within ``limit`` characters where it can be: the exception it quotes is cut short
    (``...``), never the rank, the exit or the log folder."""
    match = _RAISED.fullmatch(line)
    if len(line) <= limit or match is None:
        return line
    room = max(limit - len(match["head"]) - len(match["tail"]) - 3, _SHORTEST_EXCEPTION)
    return match["head"] + match["exception"][:room].rstrip() + "..." + match["tail"]


def _tag(outcome: ProcessOutcome) -> str:
    return "[" + outcome.label.replace(" ", "") + "] "
