"""Fault injection: every fault ends in a typed error naming the right rank, in bounded time.

One world per case (the fault breaks it), two ranks, a 3 s group timeout and a 0.2 s heartbeat.
The last rank is the faulty one (tests/reliability/faults_ranks.py). Each case asserts the survivors' error
type, the rank it names, the time from the fault to the error (3x the group timeout for a
hang, a few seconds for a death), a destroy_process_group that does not wait for the dead, and
that no process and no /dev/shm segment of the world is left behind. The figures of a run are
summarised in benchmarks/RESULTS.md ("Fault injection").

gloo and ccl ranks are plain processes (run_world's supervisor would stop the survivors at the
first death); mpi ranks run under mpirun, which ends the job itself when a rank dies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from commlayer.core.ports import free_port
from commlayer.core.shm_files import release_regions_of
from commlayer.testing import require_mpirun
from commlayer.testing.fork_server import warm_command
from commlayer.testing.mpi import mpirun_plan

pytestmark = [pytest.mark.multirank, pytest.mark.slow]

GROUP_TIMEOUT_S = 3.0
WORLD_SIZE = 2
FAULTY = WORLD_SIZE - 1
DEATH_LIMIT_S = 8.0  # heartbeat misses (2 s) plus a loaded 2-core machine's scheduling
HANG_LIMIT_S = 3 * GROUP_TIMEOUT_S
WORLD_LIMIT_S = 120.0
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class WorldOutcome:
    records: dict[int, dict[str, Any]]
    fault: dict[str, Any] | None
    exit_codes: list[int | None]
    output: str
    t_end: float  # when the last process of the world ended (epoch seconds)

    def survivor(self, rank: int = 0) -> dict[str, Any]:
        assert rank in self.records, f"rank {rank} left no record:\n{self.output}"
        return self.records[rank]

    def seconds_to_error(self, rank: int = 0) -> float:
        assert self.fault is not None, f"the faulty rank never reached its fault:\n{self.output}"
        return self.survivor(rank)["t_error"] - self.fault["t_fault"]


def run_fault_world(
    backend: str,
    case: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    launcher_kills: bool = False,
    port: int | None = None,
) -> WorldOutcome:
    """Run ``case`` on a fresh world; kill everything left at the end and check nothing leaked.

    ``launcher_kills``: mpirun SIGKILLs every rank when one dies, so nobody of ours is left to
    remove the dead rank's /dev/shm region; the test removes it, and checks only the others'.
    ``port``: the MASTER_PORT of a local world (default: a free one).
    """
    out = tmp_path / f"{backend}-{case}"
    out.mkdir()
    shm_before = _shm_entries()
    rank_env = _environment(out, env)
    command = [sys.executable, "-m", "tests.reliability.faults_ranks", backend, case, str(out)]
    if backend == "mpi":
        plan = mpirun_plan(WORLD_SIZE, rank_env)
        processes = [_start([*plan.argv, *command], dict(plan.env), out / "mpirun.log")]
    else:
        port = port or free_port()
        warm = list(warm_command(command, rank_env))
        processes = [
            _start(warm, {**rank_env, **_rank_variables(rank, port)}, out / f"rank{rank}.log")
            for rank in range(WORLD_SIZE)
        ]
    exit_codes = _wait_all(processes, WORLD_LIMIT_S)
    t_end = time.time()
    output = "\n".join(
        f"---- {log.name} ----\n{log.read_text()[-3000:]}" for log in sorted(out.glob("*.log"))
    )
    assert None not in exit_codes, f"processes still running after {WORLD_LIMIT_S} s were killed:\n{output}"
    assert _children_gone(processes), "a rank left a child process behind"
    records = {int(path.stem[4:]): json.loads(path.read_text()) for path in out.glob("rank[0-9]*.json")}
    fault_file = out / "fault.json"
    fault = json.loads(fault_file.read_text()) if fault_file.exists() else None
    world = [*records.values()] if launcher_kills else [*records.values(), fault or {}]
    if launcher_kills and fault is not None:
        release_regions_of([fault["pid"]])
    pids = {str(record["pid"]) for record in world if "pid" in record}
    leaked = {entry for entry in _shm_entries() - shm_before if entry.split(":")[0].split(".")[-1] in pids}
    assert not leaked, f"/dev/shm entries of the world's ranks left behind: {sorted(leaked)}"
    _print_summary(backend, case, records, fault)
    return WorldOutcome(records, fault, exit_codes, output, t_end)


def _environment(out: Path, extra: dict[str, str] | None) -> dict[str, str]:
    env = {
        key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "MASTER_PORT")
    }
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")])),
        PYTHONUNBUFFERED="1",
        FAULT_GROUP_TIMEOUT=str(GROUP_TIMEOUT_S),
        COMMLAYER_HEARTBEAT_INTERVAL="0.2",
        COMMLAYER_HEARTBEAT_MISSES="10",
        COMMLAYER_TRACE_DIR=str(out / "trace"),
        FAULT_SEED=str(os.getpid()),
    )
    env.pop("COMMLAYER_DEBUG", None)
    env.update(extra or {})
    return env


def _rank_variables(rank: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(WORLD_SIZE),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(WORLD_SIZE),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as sink:
        return subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait_all(processes: list[subprocess.Popen[bytes]], limit_s: float) -> list[int | None]:
    deadline = time.monotonic() + limit_s
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    codes = [process.poll() for process in processes]
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, 9)  # each world runs in its own session
            process.wait()
    return codes


def _children_gone(processes: list[subprocess.Popen[bytes]]) -> bool:
    """No process of the worlds' sessions (mpirun's ranks included) still runs."""
    sessions = {process.pid for process in processes}
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        alive = [pid for pid in _pids() if _session_of(pid) in sessions]
        if not alive:
            return True
        time.sleep(0.1)
    for pid in alive:
        os.kill(pid, 9)
    return False


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _print_summary(backend: str, case: str, records: dict[int, dict[str, Any]], fault: dict | None) -> None:
    """One line per rank, read by the RESULTS table (pytest -s shows it)."""
    for rank, record in sorted(records.items()):
        after = (
            "" if fault is None or "t_error" not in record else f"{record['t_error'] - fault['t_fault']:.2f}s"
        )
        print(
            f"FAULT {backend:5} {case:15} rank {rank}: {record.get('type', record['outcome']):24} "
            f"after {after:7} names rank {record.get('failed_rank')} destroy {record.get('destroy_s')}s"
        )


# --- assertions shared by the cases ------------------------------------------------------------


def assert_peer_failure(outcome: WorldOutcome) -> None:
    record = outcome.survivor(0)
    assert record["outcome"] == "error", record
    assert record["type"] == "PeerFailureError", record
    assert "DistBackendError" in record["bases"], record
    assert record["failed_rank"] == FAULTY, record
    assert f"peer rank {FAULTY} failed" in record["message"] and "(rank 0)" in record["message"], record
    assert outcome.seconds_to_error() < DEATH_LIMIT_S, outcome.seconds_to_error()
    assert record["destroy_s"] < 3.0, record  # never waits on the dead peer


def assert_timeout_names(outcome: WorldOutcome, words: tuple[str, ...]) -> None:
    record = outcome.survivor(0)
    assert record["outcome"] == "error", record
    assert "CommTimeoutError" in record["bases"], record  # shm's ShmTimeout is one
    for word in words:
        assert word in record["message"], (word, record)
    assert outcome.seconds_to_error() < HANG_LIMIT_S, outcome.seconds_to_error()


# --- the cases -----------------------------------------------------------------------------------

DEATHS = ("exit", "abort", "sigkill", "sigterm")
CCL = pytest.mark.ccl
MPI = pytest.mark.mpi


@pytest.mark.parametrize("how", DEATHS)
def test_gloo_rank_death_is_a_peer_failure_naming_the_rank(how: str, tmp_path: Path) -> None:
    assert_peer_failure(run_fault_world("gloo", how, tmp_path))


@CCL
@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_ccl_rank_death_is_a_peer_failure_within_seconds(how: str, tmp_path: Path) -> None:
    assert_peer_failure(run_fault_world("ccl", how, tmp_path))


@MPI
def test_mpi_rank_death_ends_the_job_within_seconds(tmp_path: Path) -> None:
    """mpirun ends a job whose rank was killed; a survivor that noticed first names the rank."""
    require_mpirun()
    outcome = run_fault_world("mpi", "sigkill", tmp_path, launcher_kills=True)
    assert outcome.exit_codes[0] != 0, outcome.output
    record = outcome.records.get(0)
    if record is not None and record["outcome"] == "error":
        assert record["type"] == "PeerFailureError" and record["failed_rank"] == FAULTY, record
        assert outcome.seconds_to_error() < DEATH_LIMIT_S


# mpi's skipped collective ends its job (MPI cannot cancel it): tests/reliability/test_faults_defaults.py.
@pytest.mark.parametrize("backend", ["gloo", pytest.param("ccl", marks=CCL)])
def test_skipped_collective_times_out_with_the_op_and_group_named(backend: str, tmp_path: Path) -> None:
    outcome = run_fault_world(backend, "skip", tmp_path)
    assert_timeout_names(outcome, ("all_reduce", "'world'", "rank 0"))


@pytest.mark.parametrize("backend", ["gloo", pytest.param("ccl", marks=CCL)])
def test_skipped_collective_in_debug_mode_names_the_missing_rank(backend: str, tmp_path: Path) -> None:
    outcome = run_fault_world(backend, "skip", tmp_path, {"COMMLAYER_DEBUG": "detail"})
    assert_timeout_names(outcome, (f"rank {FAULTY} did not call collective", "all_reduce", "(rank 0)"))


@CCL
def test_ccl_skipped_barrier_times_out(tmp_path: Path) -> None:
    """oneCCL's barrier blocks in its posting call: it runs on a helper thread, bounded. That
    thread is still inside oneCCL when the survivor exits, whose teardown it used to crash (rc -11):
    the process now leaves with its own status."""
    outcome = run_fault_world("ccl", "skip_barrier", tmp_path)
    assert_timeout_names(outcome, ("barrier", "'world'", "rank 0"))
    assert outcome.exit_codes == [0, 0], outcome.output


@pytest.mark.parametrize("backend", ["gloo", pytest.param("ccl", marks=CCL), pytest.param("mpi", marks=MPI)])
@pytest.mark.parametrize("kind", ["mismatch_size", "mismatch_dtype", "mismatch_op"])
def test_mismatch_in_debug_mode_raises_on_every_rank_naming_each_call(
    backend: str, kind: str, tmp_path: Path
) -> None:
    if backend == "mpi":
        require_mpirun()
    if backend != "gloo" and kind != "mismatch_size":
        pytest.skip("one mismatch per native backend keeps the suite in its CI budget; gloo runs all three")
    outcome = run_fault_world(backend, kind, tmp_path, {"COMMLAYER_DEBUG": "detail"})
    for rank in range(WORLD_SIZE):
        record = outcome.survivor(rank)
        assert record["type"] == "CollectiveMismatchError", record
        message = record["message"]
        assert "all_reduce(float32[4])" in message and "checked by debug mode" in message, record
        assert f"collectives: rank {rank} called" in message and f"peer rank {1 - rank} called" in message, (
            record
        )


def test_slow_rank_is_neither_dead_nor_wrong(tmp_path: Path) -> None:
    outcome = run_fault_world("gloo", "slow", tmp_path)
    assert all(outcome.survivor(rank)["outcome"] == "returned" for rank in range(WORLD_SIZE)), outcome.records


def test_unmatched_recv_times_out_naming_the_op(tmp_path: Path) -> None:
    outcome = run_fault_world("gloo", "unmatched_recv", tmp_path)
    assert_timeout_names(outcome, ("recv", "(rank 0)"))
