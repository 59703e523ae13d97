"""Run a fault-tolerant job under ``commlayer run --ft`` and break it from outside, as a user would.

:func:`run_job` starts the launcher on ``commlayer.testing.ft_member`` members (or any program
that trains with :mod:`commlayer.ft`), reads the launcher's store for the members' progress and
pids, and injects the :class:`FaultPlan`'s fault: ``sigkill`` or ``sigterm`` of a member, a
``hang`` (its loop stops while its heartbeat goes on: its peers drop it and it leaves), a member
whose replacements fail to start (``restart-fails``), or the death of the launcher that hosts the
store (``store-host``); with ``second``, one more SIGKILL in the broken replica while it recovers
(the replacement or its partner). The result holds the launcher's exit status and record
(``ft_job.json``), every member start's report, and the largest deviation of the final parameters
from a one-process replay that drops the same contributions (:func:`.ft_member.reference`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.core.ports import free_port
from commlayer.core.processes import pid_running
from commlayer.launch.supervise import child_setup
from commlayer.testing.ft_member import reference

__all__ = ["FAULTS", "FaultPlan", "JobResult", "RunningJob", "random_plan", "run_job"]

FAULTS = ("sigkill", "sigterm", "hang")  # what random_plan draws; see FaultPlan for the others
_SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "restart-fails": signal.SIGKILL}


@dataclass(frozen=True)
class FaultPlan:
    """Break ``member`` with ``fault`` once it finished ``step`` (see the module docstring)."""

    member: int | None = None
    step: int = 0
    fault: str = "sigkill"  # sigkill | sigterm | hang | restart-fails | store-host
    second: bool = False


@dataclass
class JobResult:
    """What one job did (see the module docstring); ``ended_s`` is how long after the last fault
    the launcher exited, ``members_gone_s`` how long after the store host's death (``store-host``)
    every member was gone."""

    completed: bool
    max_error: float
    seconds: float
    hung: bool
    exit_code: int | None
    ended_s: float | None = None
    members: dict[str, dict] = field(default_factory=dict)
    contributions: dict[int, list[int]] = field(default_factory=dict)
    job: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    output: str = ""
    members_gone_s: float | None = None


def random_plan(
    rng: random.Random, members: int, steps: int, second: bool, faults: tuple[str, ...] = FAULTS
) -> FaultPlan:
    """A random victim, step (early enough for a replacement to join) and fault of ``faults``."""
    return FaultPlan(rng.randrange(members), rng.randrange(2, max(3, steps // 3)), rng.choice(faults), second)


class RunningJob:
    """A launcher started as a subprocess on a job whose store listens on ``port``, and that store
    read from outside (:meth:`ft_run`: ``commlayer run --ft``)."""

    def __init__(
        self, workdir: Path, command: list[str], env: dict[str, str], port: int, log_dir: Path
    ) -> None:
        self.workdir, self.port, self.log_dir = workdir, port, log_dir
        workdir.mkdir(parents=True, exist_ok=True)
        self.output = open(workdir / "launcher.log", "w")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(  # its own group, and it dies with this process
            command,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=child_setup(),  # noqa: PLW1509 - PR_SET_PDEATHSIG has no Popen equivalent
        )
        self.started = time.time()
        self.members_gone_s: float | None = None
        self.store = self._connect()

    @classmethod
    def ft_run(
        cls, workdir: Path, launcher_args: list[str], program: list[str], env: dict[str, str]
    ) -> RunningJob:
        """``commlayer run --ft LAUNCHER_ARGS PROGRAM`` with its store on a free port."""
        port, log_dir = free_port(), workdir / "logs"
        command = [sys.executable, "-m", "commlayer", "run", "--ft", "--master-port", str(port)]
        command += ["--log-dir", str(log_dir), *launcher_args, *program]
        return cls(workdir, command, env, port, log_dir)

    def _connect(self) -> torch_dist.Store:
        """A client of the launcher's store once it listens (polled quietly: torch logs each retry)."""
        deadline = time.monotonic() + 180
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the launcher's store never listened on port {self.port}: {self.text()}")
            time.sleep(0.05)
        return torch_dist.TCPStore(
            "127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=30), wait_for_workers=False
        )

    def value(self, key: str) -> str | None:
        """A key of the launcher's store, or None (also once the launcher is gone)."""
        if self.process.poll() is not None:
            return None
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except RuntimeError:
            return None

    def member_pid(self, member: int) -> int | None:
        beat = self.value(f"ft/hb/{member}")
        return None if beat is None else json.loads(beat)["pid"]

    def wait_for(self, condition: Any, deadline: float) -> bool:
        """Poll ``condition()`` until it holds or the launcher exits or ``deadline`` passes."""
        while not condition():
            if time.time() > deadline or self.process.poll() is not None:
                return False
            time.sleep(0.005)
        return True

    def wait(self, deadline: float) -> tuple[int | None, bool]:
        """The launcher's exit status, and whether it had to be killed at ``deadline``."""
        try:
            code = self.process.wait(timeout=max(0.1, deadline - time.time()))
            hung = False
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            code, hung = self.process.wait(), True
        self.output.close()
        return code, hung

    def text(self) -> str:
        return (self.workdir / "launcher.log").read_text(errors="replace")


def run_job(
    workdir: Path,
    plan: FaultPlan,
    *,
    backend: str = "gloo",
    device: str = "cpu",
    stage: int = 2,
    steps: int = 20,
    replicas: int = 2,
    shards: int = 2,
    step_time: float = 0.0,
    hang_timeout: float = 1.5,
    max_restarts: int = 3,
    deadline_s: float = 120.0,
    seed: int = 0,
) -> JobResult:
    """Run one job under ``plan`` in ``workdir`` (see the module docstring)."""
    rng = random.Random(seed)
    reports = workdir / "reports"
    reports.mkdir(parents=True, exist_ok=True)
    program = ["-m", "commlayer.testing.ft_member", "--out", str(reports)]
    program += [
        "--replicas",
        str(replicas),
        "--shards",
        str(shards),
        "--backend",
        backend,
        "--device",
        device,
    ]
    program += ["--stage", str(stage), "--steps", str(steps), "--step-time", str(step_time)]
    program += ["--hang-timeout", str(hang_timeout)] + (
        ["--fail-restarts"] if plan.fault == "restart-fails" else []
    )
    launcher = ["-n", str(replicas * shards), "--max-restarts", str(max_restarts)]
    job = RunningJob.ft_run(workdir, launcher, program, {**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = job.started + deadline_s
    faulted = _inject(job, plan, shards, rng, deadline)
    code, hung = job.wait(deadline)
    failed_starts = [float(path.read_text()) for path in reports.glob("*.failed")]
    last_fault = max([faulted, *failed_starts]) if faulted is not None else None
    ended = None if last_fault is None else time.time() - last_fault
    return _collect(job, code, hung, ended, steps, shards, replicas * shards, reports)


def _inject(
    job: RunningJob, plan: FaultPlan, shards: int, rng: random.Random, deadline: float
) -> float | None:
    """Break the job as planned; when the last fault happened (None: no fault)."""
    if plan.member is None:
        return None
    if plan.fault == "hang":
        job.store.set(f"hang/{plan.member}", str(plan.step))
    reached = job.wait_for(lambda: int(job.value(f"progress/{plan.member}") or 0) >= plan.step, deadline)
    if not reached:
        return None
    faulted = time.time()
    if plan.fault == "store-host":
        members = [job.member_pid(member) for member in range(job_members(job))]
        os.kill(job.process.pid, signal.SIGKILL)
        while any(pid is not None and pid_running(pid) for pid in members) and time.time() < faulted + 10:
            time.sleep(0.005)
        if not any(pid is not None and pid_running(pid) for pid in members):
            job.members_gone_s = time.time() - faulted
        return faulted
    first = job.member_pid(plan.member)
    if plan.fault in _SIGNALS and first is not None:
        os.kill(first, _SIGNALS[plan.fault])
    if plan.second:
        faulted = _second_kill(job, plan, shards, rng, first, deadline)
    return faulted


def _second_kill(
    job: RunningJob, plan: FaultPlan, shards: int, rng: random.Random, first: int | None, deadline: float
) -> float:
    """SIGKILL the replacement (once it runs) or the victim's partner, while the replica recovers."""
    assert plan.member is not None
    partner = plan.member // shards * shards + (plan.member % shards + 1) % shards
    victim = rng.choice([plan.member, partner])
    if victim == plan.member:  # the replacement: a new process in the slot
        job.wait_for(lambda: job.member_pid(plan.member) not in (None, first), deadline)
    time.sleep(rng.uniform(0.0, 0.5))
    pid = job.member_pid(victim)
    if pid is not None and pid_running(pid):
        os.kill(pid, signal.SIGKILL)
    return time.time()


def _collect(
    job: RunningJob,
    code: int | None,
    hung: bool,
    ended: float | None,
    steps: int,
    shards: int,
    slots: int,
    reports: Path,
) -> JobResult:
    record_path = job.log_dir / "ft_job.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    contributions = {int(step): replicas for step, replicas in record.get("contributions", {}).items()}
    members = {path.stem: json.loads(path.read_text()) for path in sorted(reports.glob("m*r*.json"))}
    # Each slot's last start (the record counts restarts) must have trained every step.
    restarts = {int(member): count for member, count in record.get("restarts", {}).items()}
    latest = [f"m{member}r{restarts.get(member, 0)}" for member in range(slots)]
    finished = {
        label: members[label] for label in latest if members.get(label, {}).get("status") == "finished"
    }
    errors = [
        f"{label}: {members.get(label, {}).get('status', 'no report')}"
        for label in latest
        if label not in finished
    ]
    completed = code == 0 and not hung and len(contributions) == steps and len(finished) == slots
    max_error = float("inf")
    if len(contributions) == steps and finished:
        want = reference(steps, shards, contributions)
        max_error = max(
            float((torch.tensor(m["params"], dtype=want.dtype) - want).abs().max()) for m in finished.values()
        )
    for report in members.values():
        report.pop("params")
    seconds = time.time() - job.started
    return JobResult(
        completed,
        max_error,
        seconds,
        hung,
        code,
        ended,
        members,
        contributions,
        record,
        errors,
        job.text(),
        job.members_gone_s,
    )


def job_members(job: RunningJob) -> int:
    """How many member slots have a heartbeat in the job's store."""
    count = 0
    while job.value(f"ft/hb/{count}") is not None:
        count += 1
    return count
