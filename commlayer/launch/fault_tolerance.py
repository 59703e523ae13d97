"""``commlayer run --ft``: supervise a fault-tolerant job, whose members survive each other.

The launcher hosts the job's store in its own process, so the store outlives every member, and
gives each member's slot a keeper (:mod:`.slot_keeper`) that restarts the member in place when it
dies; the other members train on (:mod:`commlayer.ft`). Every member sees torchrun's variables,
``MASTER_ADDR:MASTER_PORT`` naming the launcher's store with ``TORCHELASTIC_USE_AGENT_STORE=True``
(as under torchrun's agent, so nobody else hosts one) and ``$COMMLAYER_FT_STORE``.

The job ends by itself when every member finished. It ends early, stopping every member, when a
keeper gives up (the member's restarts are spent) or when the members find that no live member
holds some shard of the state; one summary line then names the member, its restarts and the last
step committed, the exit status is non-zero, and the checkpoints the members wrote stay loadable.
``<log dir>/ft_job.json`` keeps the job's record: restarts, rejoins, and which replicas each step
averaged (:class:`commlayer.ft.record.JobRecord`).

Under mpirun, which ends a job at the first death (MPI without ULFM), ``--ft`` says so in one line
and restarts the whole job from its last checkpoint instead (``--max-restarts``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from commlayer.core import settings
from commlayer.launch.local import LaunchConfig, launch
from commlayer.launch.report import final_report
from commlayer.launch.slot_keeper import GAVE_UP, keeper_command
from commlayer.launch.supervise import LaunchResult, SuperviseOptions

__all__ = [
    "DEFAULT_MAX_RESTARTS",
    "KILL_GRACE_S",
    "HostedStore",
    "mpirun_fallback_line",
    "report_lines",
    "run_here",
]

DEFAULT_MAX_RESTARTS = 3
# Ctrl-C ends every member within two of these: the forwarded signal's grace, then SIGTERM's.
KILL_GRACE_S = 1.0
_PREFIX = "commlayer run --ft"


class HostedStore:
    """The job's store, hosted by this process on ``port`` (0: a free one), and its record."""

    def __init__(self, address: str, port: int | None, members: int) -> None:
        import torch.distributed as torch_dist  # only --ft jobs pay for torch here

        from commlayer.ft.environment import job_prefix
        from commlayer.ft.record import JobRecord

        self.store = torch_dist.TCPStore(
            address, port or 0, None, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False
        )
        self.address, self.port, self.members = address, self.store.port, members
        self.record = JobRecord(self.store, job_prefix("ft", 0))

    def environment(self) -> dict[str, str]:
        """What every member needs to find the store (see the module docstring)."""
        return {
            settings.FT_STORE.name: f"{self.address}:{self.port}",
            "MASTER_ADDR": self.address,
            "MASTER_PORT": str(self.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }

    def failure_check(self) -> Callable[[], str | None]:
        """A supervisor's stop_check: the members' verdict that the job cannot go on."""

        def check() -> str | None:
            try:
                return self.record.failure()
            except Exception:  # noqa: BLE001 - the store is ending with the launcher
                return None

        return check


def run_here(
    command: tuple[str, ...],
    nproc: int,
    master_addr: str,
    master_port: int | None,
    max_restarts: int,
    environ: Mapping[str, str],
    options: SuperviseOptions,
) -> tuple[LaunchResult, HostedStore]:
    """``nproc`` members of a fault-tolerant job on this host, each under its slot keeper."""
    hosted = HostedStore(master_addr, master_port, nproc)
    config = LaunchConfig(
        command=keeper_command(command, max_restarts),
        nproc_per_node=nproc,
        master_addr=master_addr,
        master_port=hosted.port,
        env={**environ, **hosted.environment()},
        options=replace(
            options,
            hold_tracebacks=True,
            settle=0.0,
            kill_grace=KILL_GRACE_S,
            stop_check=hosted.failure_check(),
        ),
    )
    return launch(config), hosted


def report_lines(result: LaunchResult, hosted: HostedStore, log_dir: Path | None) -> list[str]:
    """What to print once the job ended, and ``<log_dir>/ft_job.json`` written."""
    record = _job_record(result, hosted)
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "ft_job.json").write_text(json.dumps(record, indent=1))
    lines = final_report(result, log_dir)
    committed = record["committed"]
    last = "none" if committed is None else str(committed)
    where = f"; every member's output is in {log_dir}/rank<N>.log" if log_dir is not None else ""
    others = (
        f"stopped {len(result.stopped_labels)} other member{'' if len(result.stopped_labels) == 1 else 's'}"
    )
    if result.first_failure is not None:
        gave_up = _gave_up_line(result)
        what = gave_up or result.outcomes[result.first_failure].label + " failed"
        return [
            *lines[:-1],
            f"{_PREFIX}: {what}; last step committed: {last}; {others}; its checkpoints stay loadable{where}",
        ]
    if result.stop_reason is not None:
        return [*lines[:-1], f"{_PREFIX}: {result.stop_reason}; last step committed: {last}; {others}{where}"]
    if result.exit_code == 0 and record["restarts"]:
        restarted = ", ".join(_restart_note(int(m), n, record) for m, n in sorted(record["restarts"].items()))
        lines.append(f"{_PREFIX}: every member finished (last step committed: {last}); {restarted}")
    return lines


def mpirun_fallback_line(max_restarts: int) -> str:
    """The one line ``--ft`` prints when mpirun starts the members."""
    return (
        f"{_PREFIX}: mpirun ends the job when any member dies (MPI without ULFM cannot survive a death): "
        f"restarting the whole job from its last checkpoint instead, up to {max_restarts} times"
    )


def _job_record(result: LaunchResult, hosted: HostedStore) -> dict[str, Any]:
    try:
        record = hosted.record.summary(hosted.members)
    except Exception as error:  # noqa: BLE001 - a member may have left the store unreadable
        record = {"unreadable": str(error), "committed": None, "restarts": {}, "rejoined": {}}
    outcome = "finished" if result.exit_code == 0 else "stopped" if result.signal_received else "failed"
    exits = {outcome.label: outcome.exit_code for outcome in result.outcomes}
    return {"outcome": outcome, "exit_code": result.exit_code, **record, "exit_codes": exits}


def _gave_up_line(result: LaunchResult) -> str | None:
    assert result.first_failure is not None
    for line in reversed(result.outcomes[result.first_failure].output_tail):
        if GAVE_UP in line:
            return line.removeprefix("commlayer run: ")
    return None


def _restart_note(member: int, restarts: int, record: Mapping[str, Any]) -> str:
    times = "once" if restarts == 1 else f"{restarts} times"
    rejoined = record["rejoined"].get(member)
    if rejoined is None:
        return f"rank {member} restarted {times} in its slot"
    return (
        f"rank {member} restarted {times} in its slot and rejoined at step {rejoined['step']} "
        f"{rejoined['since_start_s']:.1f}s after it started"
    )
