"""`commlayer run --ft`: the members of a fault-tolerant job survive each other, under the launcher.

Every test here runs the real launcher on examples/fault_tolerant_training.py (2 replicas x 2
shards, ZeRO stage 2) or on commlayer.testing.ft_member, and breaks the job from outside the way
a user would: a kill of a member's pid read from the launcher's store, a signal to the launcher,
or the launcher's own death. tests/launch/ft_launch_ranks.py is the example with replacements
that fail to start.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import signal
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

from commlayer.core.ports import free_port
from commlayer.core.processes import pid_running
from commlayer.ft.checkpoint import read_parameters
from commlayer.testing import require_mpirun
from commlayer.testing.fault_injection import FaultPlan, RunningJob, run_job

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "fault_tolerant_training.py")
FAILING = str(REPO / "tests" / "launch" / "ft_launch_ranks.py")
STEPS, EVERY = 50, 10
pytestmark = pytest.mark.multirank


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fault_tolerant_training", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _load_example()  # the example itself, for its replay


def _example_args(checkpoints: Path, backend: str = "gloo", steps: int = STEPS) -> list[str]:
    return [
        *("--steps", str(steps), "--backend", backend, "--dtype", "float64"),
        *("--checkpoint-every", str(EVERY), "--checkpoint-dir", str(checkpoints), "--step-time", "0.15"),
    ]


def _start(tmp_path: Path, program: list[str], *launcher: str) -> RunningJob:
    return RunningJob.ft_run(
        tmp_path, ["-n", "4", *launcher], program, {**os.environ, "OMP_NUM_THREADS": "1"}
    )


def _committed(job: RunningJob) -> int:
    return int(job.value("ft/committed") or -1)


def _replay(contributions: dict[int, list[int]], steps: int) -> dict[str, torch.Tensor]:
    """The example's model trained in one process on the batches of the replicas that contributed."""
    model = example.build_model(torch.float64)
    optimizer = example.make_optimizer(list(model.parameters()))
    for step in range(steps):
        replicas = contributions[step]
        optimizer.zero_grad()
        for replica in replicas:
            for shard in range(2):
                (example.loss_of(model, step, replica, shard) / (2 * len(replicas))).backward()
        optimizer.step()
    return {name: param.detach() for name, param in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "shm"])
def test_a_member_killed_at_a_random_step_rejoins_and_the_result_is_exact(
    tmp_path: Path, backend: str
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    victim, step = rng.randrange(4), rng.randrange(2, 10)
    job = _start(tmp_path, [EXAMPLE, *_example_args(tmp_path / "checkpoints", backend)])
    deadline = job.started + 150
    assert job.wait_for(lambda: _committed(job) >= step, deadline), job.text()
    os.kill(job.member_pid(victim), signal.SIGKILL)
    code, hung = job.wait(deadline)
    output = job.text()
    why = f"seed {seed}: member {victim} killed after step {step}\n{output}"
    assert (code, hung) == (0, False), why
    finished = re.findall(r"member (\d): trained to step (\d+)", output)
    assert sorted(set(finished)) == [(str(m), str(STEPS)) for m in range(4)], why
    record = json.loads((job.log_dir / "ft_job.json").read_text())
    assert record["restarts"] == {str(victim): 1}, why
    assert record["rejoined"][str(victim)]["step"] < STEPS, why  # the replacement caught up
    contributions = {int(t): replicas for t, replicas in record["contributions"].items()}
    assert sorted(contributions) == list(range(STEPS)) and contributions[STEPS - 1] == [0, 1], why
    saved_step, saved = read_parameters(tmp_path / "checkpoints")
    assert saved_step == STEPS, why
    for name, want in _replay(contributions, STEPS).items():
        assert torch.allclose(saved[name], want, rtol=0, atol=1e-6), (name, why)


@pytest.mark.slow
def test_spent_restarts_end_the_job_with_one_summary_within_5s(tmp_path: Path) -> None:
    mark = tmp_path / "last_failed_start"
    job = _start(
        tmp_path,
        [FAILING, "fail-restarts", str(mark), *_example_args(tmp_path / "checkpoints")],
        "--max-restarts",
        "1",
    )
    deadline = job.started + 150
    assert job.wait_for(lambda: _committed(job) >= EVERY + 2, deadline), job.text()
    os.kill(job.member_pid(2), signal.SIGKILL)
    code, hung = job.wait(deadline)
    ended = time.time()
    output = job.text()
    assert code not in (0, None) and not hung, output
    assert ended - float(mark.read_text()) < 5.0, output
    summary = [line for line in output.splitlines() if line.startswith("commlayer run --ft:")]
    assert len(summary) == 1, output
    assert re.fullmatch(
        r"commlayer run --ft: rank 2 gave up after 1 restart in its slot: it exited with code 1; "
        r"last step committed: \d+; stopped 3 other members; its checkpoints stay loadable; .*",
        summary[0],
    ), summary
    assert read_parameters(tmp_path / "checkpoints")[0] >= EVERY  # the newest checkpoint loads


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_ends_every_member_within_3s_and_leaves_no_shm_file(
    tmp_path: Path, signum: signal.Signals
) -> None:
    before = set(os.listdir("/dev/shm"))
    job = _start(tmp_path, [EXAMPLE, *_example_args(tmp_path / "checkpoints", "shm")])
    deadline = job.started + 120
    assert job.wait_for(lambda: _committed(job) >= 2, deadline), job.text()
    members = [job.member_pid(m) for m in range(4)]
    sent = time.time()
    os.kill(job.process.pid, signum)
    assert job.wait_for(lambda: not any(pid_running(pid) for pid in members), sent + 3.0) or not any(
        pid_running(pid) for pid in members
    ), job.text()
    gone = time.time() - sent
    code, hung = job.wait(sent + 10)
    assert gone < 3.0 and not hung and code == 128 + signum, (gone, code, job.text())
    # Other jobs on the machine may add files meanwhile: only this job's count.
    ours = [name for name in set(os.listdir("/dev/shm")) - before if _of_processes(name, members)]
    assert ours == []


def _of_processes(name: str, pids: list[int | None]) -> bool:
    """Whether /dev/shm file ``name`` belongs to one of ``pids`` or to commlayer."""
    return name.startswith("commlayer") or any(str(pid) in re.split(r"[^0-9]+", name) for pid in pids)


@pytest.mark.slow
def test_the_store_hosts_death_ends_every_member_and_the_checkpoint_loads(tmp_path: Path) -> None:
    job = _start(tmp_path, [EXAMPLE, *_example_args(tmp_path / "checkpoints")])
    deadline = job.started + 120
    assert job.wait_for(lambda: _committed(job) >= EVERY + 1, deadline), job.text()
    members = [job.member_pid(m) for m in range(4)]
    os.kill(job.process.pid, signal.SIGKILL)
    killed = time.time()
    while any(pid_running(pid) for pid in members) and time.time() < killed + 3:
        time.sleep(0.01)
    assert not any(pid_running(pid) for pid in members), job.text()
    job.wait(killed + 5)
    assert read_parameters(tmp_path / "checkpoints")[0] == EVERY


@pytest.mark.slow
def test_a_hung_member_is_dropped_leaves_and_comes_back(tmp_path: Path) -> None:
    result = run_job(tmp_path, FaultPlan(member=1, step=3, fault="hang"), steps=40, step_time=0.15)
    assert result.completed, (result.errors, result.output)
    assert result.max_error <= 1e-6 and result.job["restarts"] == {"1": 1}, result.output
    assert "its peers dropped it as hung" in result.output


def _fault_free(steps: int) -> dict[int, list[int]]:
    return {step: [0, 1] for step in range(steps)}


def _whole_job_restart(job: RunningJob, tmp_path: Path, steps: int) -> str:
    """Kill member 1 after the first checkpoint; the job must start again from it and finish as if
    nothing happened (a death ends a start before any step drops a contribution)."""
    deadline = job.started + 200
    assert job.wait_for(lambda: _committed(job) >= EVERY + 2, deadline), job.text()
    os.kill(job.member_pid(1), signal.SIGKILL)
    code, hung = job.wait(deadline)
    output = job.text()
    assert (code, hung) == (0, False), output
    assert re.search(r"resuming at step [1-9]0 from", output), output
    saved_step, saved = read_parameters(tmp_path / "checkpoints")
    assert saved_step == steps, output
    for name, want in _replay(_fault_free(steps), steps).items():
        assert torch.allclose(saved[name], want, rtol=0, atol=1e-6), (name, output)
    return output


@pytest.mark.slow
def test_under_torchrun_a_death_restarts_the_whole_job_from_its_checkpoint(tmp_path: Path) -> None:
    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--max-restarts", "1"]
    torchrun += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--monitor-interval", "0.1"]
    command = [*torchrun, EXAMPLE, *_example_args(tmp_path / "checkpoints", steps=30)]
    job = RunningJob(tmp_path, command, {**os.environ, "OMP_NUM_THREADS": "1"}, port, tmp_path)
    output = _whole_job_restart(job, tmp_path, 30)
    assert output.count("commlayer.ft: under torchrun a member's death restarts every member") == 2, output


@pytest.mark.slow
@pytest.mark.mpi
def test_under_mpirun_ft_says_so_and_restarts_the_whole_job_from_its_checkpoint(tmp_path: Path) -> None:
    require_mpirun()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    launcher = ["--launcher", "mpirun", "-n", "4", "--max-restarts", "1"]
    job = RunningJob.ft_run(
        tmp_path, launcher, [EXAMPLE, *_example_args(tmp_path / "checkpoints", steps=30)], env
    )
    output = _whole_job_restart(job, tmp_path, 30)
    line = (
        "commlayer run --ft: mpirun ends the job when any member dies (MPI without ULFM cannot survive a "
        "death): restarting the whole job from its last checkpoint instead, up to 1 times"
    )
    assert output.splitlines()[0] == line and output.count(line) == 1, output
    assert "restarting every rank (restart 1 of 1)" in output, output
