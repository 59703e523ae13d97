"""Run a fault-tolerant training job of ``commlayer.testing.ft_member`` processes and break it.

The parent hosts the job's store (as a launcher would), starts one process per member, kills
members as a :class:`FaultPlan` says (SIGKILL, SIGTERM, or a hang: the member's loop stops while
its heartbeat goes on), starts a replacement for each dead member, and checks the survivors'
final parameters against a one-process replay that drops the same contributions.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as torch_dist

from commlayer.testing.ft_member import reference

__all__ = ["FaultPlan", "JobResult", "random_plan", "run_job"]

FAULTS = ("sigkill", "sigterm", "hang")


@dataclass(frozen=True)
class FaultPlan:
    """Kill ``member`` with ``fault`` once it finished ``step``; with ``second``, also SIGKILL a
    member of the broken replica (the replacement or its partner) while it recovers."""

    member: int | None = None
    step: int = 0
    fault: str = "sigkill"
    second: bool = False


@dataclass
class JobResult:
    """What one job did: whether every member that should finish trained every step, the largest
    deviation from the replay, seconds from start to the last exit, and per-member summaries."""

    completed: bool
    max_error: float
    seconds: float
    hung: bool
    members: dict[str, dict] = field(default_factory=dict)
    contributions: dict[int, list[int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def random_plan(rng: random.Random, members: int, steps: int, second: bool) -> FaultPlan:
    """A random victim, step (away from the last steps, so a replacement has time to join) and fault."""
    return FaultPlan(rng.randrange(members), rng.randrange(1, steps // 3), rng.choice(FAULTS), second)


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
    deadline_s: float = 120.0,
    seed: int = 0,
) -> JobResult:
    """Run one job under ``plan`` in ``workdir`` (see the module docstring)."""
    rng = random.Random(seed)
    store = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    workdir.mkdir(parents=True, exist_ok=True)
    common = [
        "--store", f"127.0.0.1:{store.port}", "--replicas", str(replicas), "--shards", str(shards),
        "--backend", backend, "--device", device, "--stage", str(stage), "--steps", str(steps),
        "--step-time", str(step_time), "--hang-timeout", str(hang_timeout),
    ]  # fmt: skip
    job = _Job(workdir, common)
    started = time.time()
    if plan.member is not None and plan.fault == "hang":
        store.set(f"hang/{plan.member}", str(plan.step))
    for member in range(replicas * shards):
        job.start(member)
    victims = _victims(plan, shards, rng)
    for victim in victims:
        job.start(victim, spare=True)
    hung = not _inject(job, store, plan, victims, rng, started + deadline_s, hang_timeout)
    hung = hung or not job.wait_all(started + deadline_s, store)
    seconds = time.time() - started
    return _check(job, store, steps, shards, seconds, hung)


class _Job:
    def __init__(self, workdir: Path, common: list[str]) -> None:
        self.workdir, self.common = workdir, common
        self.processes: dict[str, subprocess.Popen] = {}
        self.current: dict[int, str] = {}

        self.spares: dict[int, list[str]] = {}

    def start(self, member: int, spare: bool = False) -> str:
        """Start a member process; a spare waits for :meth:`replace` (its start-up is hidden)."""
        label = (
            f"m{member}" if not spare and member not in self.current else f"m{member}r{len(self.processes)}"
        )
        out = self.workdir / f"{label}.json"
        log = open(self.workdir / f"{label}.log", "w")  # noqa: SIM115 - the child owns it
        command = [
            sys.executable,
            "-m",
            "commlayer.testing.ft_member",
            "--member",
            str(member),
            "--out",
            str(out),
        ]
        command += ["--wait-key", f"go/{label}"] if spare else []
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.processes[label] = subprocess.Popen(command + self.common, stdout=log, stderr=log, env=env)
        if spare:
            self.spares.setdefault(member, []).append(label)
        else:
            self.current[member] = label
        return label

    def replace(self, member: int, store: torch_dist.Store) -> None:
        """Let the next spare of ``member`` join (start one now if none is left)."""
        spares = self.spares.get(member, [])
        label = spares.pop(0) if spares else self.start(member, spare=True)
        if label in self.spares.get(member, []):
            self.spares[member].remove(label)
        self.current[member] = label
        store.set(f"go/{label}", "1")

    def release_spares(self, store: torch_dist.Store) -> None:
        """Unused spares start and find the job finished (so every process ends)."""
        for labels in self.spares.values():
            for label in labels:
                store.set(f"go/{label}", "1")

    def kill(self, member: int, signum: int) -> None:
        process = self.processes[self.current[member]]
        if process.poll() is None:
            process.send_signal(signum)
            process.wait()

    def wait_all(self, deadline: float, store: torch_dist.Store) -> bool:
        for label in self.current.values():
            try:
                self.processes[label].wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                break
        self.release_spares(store)
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                for other in self.processes.values():
                    other.kill()
                return False
        return True


def _progress(store: torch_dist.Store, member: int) -> int:
    key = f"progress/{member}"
    return int(store.get(key)) if store.check([key]) else 0


def _victims(plan: FaultPlan, shards: int, rng: random.Random) -> list[int]:
    """The members to kill: the planned one, then (``plan.second``) its replacement or its partner."""
    if plan.member is None:
        return []
    if not plan.second:
        return [plan.member]
    partner = plan.member // shards * shards + (plan.member % shards + 1) % shards
    return [plan.member, rng.choice([plan.member, partner])]


def _inject(
    job: _Job,
    store: torch_dist.Store,
    plan: FaultPlan,
    victims: list[int],
    rng: random.Random,
    deadline: float,
    hang_timeout: float,
) -> bool:
    if plan.member is None:
        return True
    spares = [f"go/{label}/ready" for labels in job.spares.values() for label in labels]
    while not store.check(spares):  # spares have imported torch: a replacement is ready at once
        if time.time() > deadline:
            return False
        time.sleep(0.01)
    while _progress(store, plan.member) < plan.step:
        if time.time() > deadline or job.processes[job.current[plan.member]].poll() is not None:
            return time.time() <= deadline
        time.sleep(0.002)
    if plan.fault == "hang":
        time.sleep(hang_timeout + 0.5)  # a supervisor notices the hang and ends the process
    job.kill(plan.member, signal.SIGTERM if plan.fault == "sigterm" else signal.SIGKILL)
    job.replace(plan.member, store)
    for victim in victims[1:]:
        time.sleep(rng.uniform(0.0, 0.5))  # while the broken replica recovers
        job.kill(victim, signal.SIGKILL)
        job.replace(victim, store)
    return True


def _check(
    job: _Job, store: torch_dist.Store, steps: int, shards: int, seconds: float, hung: bool
) -> JobResult:
    contributions = {}
    for step in range(steps):
        key = f"ft/contributions/{step}"
        if store.check([key]):
            contributions[step] = json.loads(store.get(key))
    members, errors = {}, []
    for label in job.processes:
        path = job.workdir / f"{label}.json"
        if path.exists():
            members[label] = json.loads(path.read_text())
    finished = {label: m for label, m in members.items() if m["status"] == "finished"}
    expected = {label for label in job.current.values()}
    completed = not hung and len(contributions) == steps and expected <= set(finished)
    max_error = float("inf")
    if len(contributions) == steps and finished:
        want = reference(steps, shards, contributions)
        max_error = max(
            float((torch.tensor(m["params"], dtype=want.dtype) - want).abs().max()) for m in finished.values()
        )
    for label in expected - set(finished):
        errors.append(f"{label}: {members.get(label, {}).get('status', 'no report')}")
    for summary in members.values():
        summary.pop("params")
    return JobResult(completed, max_error, seconds, hung, members, contributions, errors)
