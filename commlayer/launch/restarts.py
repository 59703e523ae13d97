"""``commlayer run --max-restarts N``: when a rank fails, start the whole world again, up to N times.

torchrun's meaning: a failed rank stops every rank, then all of them start again with a fresh
rendezvous, and the job resumes from whatever checkpoint the script loads. Each attempt gets:

- ``TORCHELASTIC_RESTART_COUNT`` (0, then 1..N) and ``TORCHELASTIC_MAX_RESTARTS``, as torchrun
  sets them; rendezvous keys are scoped by the restart count, so nothing of the failed attempt
  mixes in even where the store's port is reused (``--master-port``);
- a new free store port (unless ``--master-port`` fixes it), so rank 0 hosts a new store;
- its own job id ``<job>-restart<K>`` (flight-recorder dumps of the failed attempt are kept) and
  log folder (``DIR/restart<K>`` under ``--log-dir DIR``);
- what is left of ``--timeout``, which bounds the whole job.

Only a rank's own failure restarts the world: a timeout, a forwarded SIGINT/SIGTERM or a lost
connection ends the job as without restarts. Once the restarts are spent, the last attempt's exit
code and summary are the job's.

torch's elastic agent is not nested under this: it would spawn and watch the ranks itself, which
:func:`~.supervise.supervise` does for every launch path; the restart contract (variables, a fresh
rendezvous, all ranks at once) is the one torch.distributed.elastic workers see.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from commlayer.launch.supervise import LaunchResult

__all__ = [
    "MAX_RESTARTS_ENV",
    "RESTART_COUNT_ENV",
    "Attempt",
    "restart_line",
    "run_with_restarts",
]

RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
MAX_RESTARTS_ENV = "TORCHELASTIC_MAX_RESTARTS"

Run = TypeVar("Run")


@dataclass(frozen=True)
class Attempt:
    """One start of the world: ``restart`` is 0 for the first, then 1..``max_restarts``."""

    restart: int
    max_restarts: int
    timeout: float | None = None  # seconds left of the job's limit; None: no limit

    def environment(self) -> dict[str, str]:
        """The variables torchrun gives its workers about restarts."""
        return {RESTART_COUNT_ENV: str(self.restart), MAX_RESTARTS_ENV: str(self.max_restarts)}

    def job_id(self, job: str) -> str:
        """``job`` for the first start, ``job-restartK`` after: each attempt keeps its own dumps."""
        return job if self.restart == 0 else f"{job}-restart{self.restart}"

    def log_dir(self, base: Path | None) -> Path | None:
        """``base`` for the first start, ``base/restartK`` after; None stays None."""
        if base is None or self.restart == 0:
            return base
        return base / f"restart{self.restart}"


def run_with_restarts(
    start: Callable[[Attempt], Run],
    result_of: Callable[[Run], LaunchResult],
    max_restarts: int,
    timeout: float | None,
    on_restart: Callable[[Run, Attempt], None],
) -> Run:
    """Call ``start`` until its world succeeds, fails other than by a rank, or restarts run out.

    Args:
        start: starts one attempt's world and waits for it.
        result_of: the supervisor's result within what ``start`` returned.
        max_restarts: how many times the world may start again after a rank failed.
        timeout: seconds the whole job may take, across attempts; None for no limit.
        on_restart: told about each failed attempt just before the next one starts.

    Returns:
        What the last attempt's ``start`` returned.
    """
    if max_restarts < 0:
        raise ValueError(f"run_with_restarts: argument 'max_restarts' expected >= 0, received {max_restarts}")
    deadline = None if timeout is None else time.monotonic() + timeout
    restart, left = 0, timeout
    while True:
        attempt = Attempt(restart, max_restarts, left)
        run = start(attempt)
        left = None if deadline is None else deadline - time.monotonic()
        spent = restart >= max_restarts or (left is not None and left <= 0)
        if result_of(run).first_failure is None or spent:
            return run
        on_restart(run, attempt)
        restart += 1


def restart_line(result: LaunchResult, attempt: Attempt, prefix: str = "commlayer run") -> str:
    """``commlayer run: restarting every rank (restart 1 of 3) after rank 1 failed``."""
    first = result.outcomes[result.first_failure] if result.first_failure is not None else None
    cause = f" after {first.label} failed" if first is not None else ""
    return f"{prefix}: restarting every rank (restart {attempt.restart + 1} of {attempt.max_restarts}){cause}"
