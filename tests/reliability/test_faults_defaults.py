"""Fault injection, part two: shm, mpi's bounded skipped collective, default-mode mismatch checks,
and a MASTER_PORT held by another program or a store that never answers.

Same worlds and records as tests/reliability/test_faults.py (2 ranks, 3 s group timeout, rank 1 faulty).
Debug mode's fingerprints are the facade's, the same on every backend: tests/reliability/test_faults.py runs
them on gloo, ccl and mpi, and they were run on shm by hand (benchmarks/RESULTS.md).
Without debug mode, a mismatched collective must still never return garbage: shm compares each
op's packed signature beside its step counter, mpi runs one 32-byte Allreduce(MAX) of it first,
gloo one small allreduce(MAX) of it first (commlayer/contract/mismatch).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commlayer.testing import require_mpirun
from tests.reliability.test_faults import (
    DEATHS,
    HANG_LIMIT_S,
    WORLD_SIZE,
    WorldOutcome,
    assert_peer_failure,
    assert_timeout_names,
    run_fault_world,
)

pytestmark = [pytest.mark.multirank, pytest.mark.slow]

MPI = pytest.mark.mpi
CCL = pytest.mark.ccl
MISMATCHES = ("mismatch_size", "mismatch_dtype", "mismatch_op")


def assert_mismatch_on_every_rank(outcome: WorldOutcome, words: tuple[str, ...]) -> None:
    for rank in range(WORLD_SIZE):
        record = outcome.survivor(rank)
        assert record["outcome"] == "error", record
        assert "CollectiveMismatchError" in record["bases"], record
        assert f"collectives: rank {rank} called " in record["message"], record
        assert f"peer rank {1 - rank} called " in record["message"], record
        for word in words:
            assert word in record["message"], (word, record)


# --- shm ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", DEATHS)
def test_shm_rank_death_is_a_peer_failure_naming_the_rank(how: str, tmp_path: Path) -> None:
    assert_peer_failure(run_fault_world("shm", how, tmp_path))


def test_shm_peer_exit_slower_than_the_timeout_is_a_peer_failure(tmp_path: Path) -> None:
    """The dead rank's process outlives the group timeout after sys.exit (an exit handler sleeps
    twice the timeout). The survivor used to wait for the process to be gone and raise ShmTimeout
    at the timeout; the exiting rank now marks its departure in the segment, and the peer monitor's
    report ends native waits, so it is a PeerFailureError naming the rank, well before the timeout."""
    outcome = run_fault_world("shm", "exit_slowly", tmp_path)
    assert_peer_failure(outcome)


def test_shm_skipped_collective_times_out_naming_op_group_and_rank(tmp_path: Path) -> None:
    outcome = run_fault_world("shm", "skip", tmp_path)
    assert_timeout_names(outcome, ("all_reduce", "'world'", "rank 0"))


@pytest.mark.parametrize("kind", MISMATCHES)
def test_shm_mismatch_without_debug_mode_is_caught_before_any_data_moves(kind: str, tmp_path: Path) -> None:
    outcome = run_fault_world("shm", kind, tmp_path)
    rank1_call = {
        "mismatch_size": "all_reduce(float32[8], op sum)",
        "mismatch_dtype": "all_reduce(int32[4], op sum)",
        "mismatch_op": "broadcast(float32[4], root 0)",
    }[kind]
    assert_mismatch_on_every_rank(outcome, ("all_reduce(float32[4], op sum)", rank1_call, "'world'"))


def test_shm_slow_rank_is_neither_dead_nor_wrong(tmp_path: Path) -> None:
    outcome = run_fault_world("shm", "slow", tmp_path)
    assert all(outcome.survivor(rank)["outcome"] == "returned" for rank in range(WORLD_SIZE)), outcome.records


# --- gloo -----------------------------------------------------------------------------------------


def test_gloo_async_wait_after_a_death_names_the_op_group_and_dead_rank(tmp_path: Path) -> None:
    """A torch Work's wait raised gloo's raw text ("Connection reset by peer ... GLHF!", or its
    recv timeout); the facade now finds the op and group in its flight recorder."""
    outcome = run_fault_world("gloo", "sigkill_async", tmp_path)
    assert_peer_failure(outcome)
    assert "all_reduce on group 'world'" in outcome.survivor(0)["message"], outcome.survivor(0)


@pytest.mark.parametrize("kind", ["mismatch_dtype", "mismatch_dtype_async", "mismatch_size", "mismatch_op"])
def test_gloo_mismatch_without_debug_mode_is_caught_before_the_collective(kind: str, tmp_path: Path) -> None:
    """Without the check, float32 against int32 returned garbage with exit code 0 (as plain torch
    does), 4 against 8 elements made gloo abort rank 0, all_reduce against broadcast timed out
    (benchmarks/faults/gloo_mismatch_detection.py). Now every rank raises, sync or async, naming both calls.
    A blocking call may speculate (backends/gloo_speculation.py): a rank that entered before its
    peer's signature says so; of two disagreeing ranks at most one can have entered."""
    outcome = run_fault_world("gloo", kind, tmp_path)
    rank1_call = {
        "mismatch_dtype": "all_reduce(int32[4], op sum)",
        "mismatch_dtype_async": "all_reduce(int32[4], op sum)",
        "mismatch_size": "all_reduce(float32[8], op sum)",
        "mismatch_op": "broadcast(float32[4], root 0)",
    }[kind]
    assert_mismatch_on_every_rank(outcome, ("all_reduce(float32[4], op sum)", rank1_call, "'world'"))
    before, after = "checked by gloo before any data moved", "checked by gloo after this rank's call ran"
    endings = [outcome.survivor(rank)["message"] for rank in range(WORLD_SIZE)]
    assert all(before in message or after in message for message in endings), endings
    assert any(before in message for message in endings), endings
    if kind.endswith("_async"):  # an async call never speculates
        assert all(before in message for message in endings), endings


# --- ccl -----------------------------------------------------------------------------------------


@CCL
@pytest.mark.parametrize("kind", ["mismatch_dtype", "mismatch_size", "mismatch_op"])
def test_ccl_mismatch_without_debug_mode_is_caught_before_the_collective(kind: str, tmp_path: Path) -> None:
    """Without the check oneCCL returned garbage for float32 against int32 on both ranks (exit code
    0), and 4 against 8 elements failed rank 0 with oneCCL's raw "RECV entry failed" while rank 1
    returned; now every rank raises before the collective, naming both calls."""
    outcome = run_fault_world("ccl", kind, tmp_path)
    rank1_call = {
        "mismatch_dtype": "all_reduce(int32[4], op sum)",
        "mismatch_size": "all_reduce(float32[8], op sum)",
        "mismatch_op": "broadcast(float32[4], root 0)",
    }[kind]
    words = ("all_reduce(float32[4], op sum)", rank1_call, "'world'", "checked by ccl before any data moved")
    assert_mismatch_on_every_rank(outcome, words)


# --- mpi -----------------------------------------------------------------------------------------


@MPI
def test_mpi_skipped_blocking_collective_raises_a_catchable_timeout(tmp_path: Path) -> None:
    """Ordered mode: the survivor waits for the skipping peer in the mismatch check's exchange,
    outside MPI, so it raises CommTimeoutError at the group's timeout (the watchdog stands aside);
    the op stays abandoned, so at exit the job ends with MPI_Abort instead of MPI_Finalize."""
    require_mpirun()
    outcome = run_fault_world("mpi", "skip", tmp_path, launcher_kills=True)
    assert_timeout_names(outcome, ("all_reduce", "'world'", "rank 0"))
    assert "rank 1 did not call all_reduce" in outcome.survivor()["message"], outcome.survivor()
    assert "MPI cannot cancel a started blocking call" not in outcome.output, outcome.output
    assert "instead of MPI_Finalize" in outcome.output, outcome.output


@MPI
def test_mpi_skipped_collective_entered_speculatively_ends_the_job_at_the_timeout(tmp_path: Path) -> None:
    """reduce_scatter_tensor enters MPI before the missing peer's signature (the check's
    speculation): a thread inside MPI cannot be handed an error, so the watchdog reports it (op,
    group, rank) and ends the job with MPI_Abort, as MPI cannot cancel the call."""
    require_mpirun()
    outcome = run_fault_world("mpi", "skip_speculated", tmp_path, launcher_kills=True)
    assert outcome.exit_codes[0] != 0, outcome.output
    for words in (
        "CommTimeoutError: reduce_scatter_tensor",
        "(rank 0) on group 'world'",
        "ending the job with MPI_Abort",
    ):
        assert words in outcome.output, (words, outcome.output)
    assert outcome.fault is not None, outcome.output
    assert outcome.t_end - outcome.fault["t_fault"] < HANG_LIMIT_S, outcome.output
    # The flight-recorder watchdog dumped the stuck rank before the abort, naming the op.
    dumps = list((tmp_path / "mpi-skip_speculated" / "trace").glob("*/rank0.json"))
    assert len(dumps) == 1, outcome.output
    assert "reduce_scatter_tensor" in json.loads(dumps[0].read_text())["reason"], dumps[0].read_text()


@MPI
def test_mpi_skipped_collective_in_requests_mode_raises_then_the_job_ends_without_finalize(
    tmp_path: Path,
) -> None:
    """The timeout is raised and caught; MPI_Finalize could then wait on the abandoned request,
    so the process ends the job with MPI_Abort at exit instead (it used to hang 1 run in 5)."""
    require_mpirun()
    outcome = run_fault_world(
        "mpi", "skip", tmp_path, {"COMMLAYER_MPI_MODE": "requests"}, launcher_kills=True
    )
    assert_timeout_names(outcome, ("all_reduce", "'world'", "rank 0"))
    assert outcome.exit_codes[0] != 0, outcome.output
    assert "instead of MPI_Finalize" in outcome.output, outcome.output


@MPI
def test_mpi_size_mismatch_without_debug_mode_is_caught_before_the_collective(tmp_path: Path) -> None:
    """Intel MPI returned garbage here (exit code 0); dtype and op differences take the same path
    (tests/reliability/test_reliability_defaults_units.py checks their packing)."""
    require_mpirun()
    outcome = run_fault_world("mpi", "mismatch_size", tmp_path)
    words = ("'world'", "all_reduce(float32[4], op sum)", "all_reduce(float32[8], op sum)", "checked by mpi")
    assert_mismatch_on_every_rank(outcome, words)


# --- the store ----------------------------------------------------------------------------------


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A program that holds a port: it accepts connections (the backlog) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def _init_errors(outcome: WorldOutcome) -> dict[int, dict]:
    for rank in range(WORLD_SIZE):
        record = outcome.survivor(rank)
        assert record["outcome"] == "error", record
        assert record["t_error"] - record["t_init"] < HANG_LIMIT_S, record
    return outcome.records


def test_held_master_port_fails_every_rank_within_the_timeout(silent_listener: int, tmp_path: Path) -> None:
    records = _init_errors(run_fault_world("gloo", "init", tmp_path, port=silent_listener))
    assert records[0]["type"] == "RendezvousError", records[0]
    assert "DistNetworkError" in records[0]["bases"], records[0]
    assert f":{silent_listener}" in records[0]["message"] and "already in use" in records[0]["message"]
    assert records[1]["type"] == "CommTimeoutError", records[1]
    assert "did not answer" in records[1]["message"] and "(rank 1)" in records[1]["message"], records[1]


def test_store_that_never_answers_fails_every_rank_within_the_timeout(
    silent_listener: int, tmp_path: Path
) -> None:
    started = time.monotonic()
    env = {"TORCHELASTIC_USE_AGENT_STORE": "true"}  # no rank hosts the store: all connect to the listener
    records = _init_errors(run_fault_world("gloo", "init", tmp_path, env, port=silent_listener))
    for rank, record in records.items():
        assert record["type"] == "CommTimeoutError", record
        assert f":{silent_listener} did not answer" in record["message"], record
        assert f"(rank {rank})" in record["message"], record
    assert time.monotonic() - started < 60
