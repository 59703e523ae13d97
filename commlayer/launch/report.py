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

(the summary is one line).

A world that succeeded shows each held traceback in full (the ranks caught and went on).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from commlayer.launch.supervise import LaunchResult, ProcessOutcome

__all__ = ["default_log_dir", "final_report"]


def default_log_dir(job: str) -> Path:
    """``<tmp>/commlayer-run/<job>``: where ``commlayer run`` keeps the ranks' output by default."""
    return Path(tempfile.gettempdir()) / "commlayer-run" / job


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
        lines.append(summary + where)
    return lines


def _tag(outcome: ProcessOutcome) -> str:
    return "[" + outcome.label.replace(" ", "") + "] "
