"""Pure logic of the reliability layer: flight recorder, trace analysis, error translation, health."""

from __future__ import annotations

import gc
import json
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from commlayer.cli import main as cli_main
from commlayer.core import health
from commlayer.core.errors import CollectiveMismatchError, CommError, CommTimeoutError, PeerFailureError
from commlayer.core.flight_recorder import FlightRecorder, mark_completed, prefill, track, write_dump
from commlayer.core.work import CompletedWork
from commlayer.facade.calls.debug_check import debug_mode, describe_call
from commlayer.facade.calls.failures import translate
from commlayer.facade.groups.aborted import abort_group
from commlayer.facade.groups.group import ProcessGroup
from commlayer.trace_analysis import analyze, load_dumps


@pytest.fixture(autouse=True)
def _no_failure_left():
    health.clear()
    yield
    health.clear()


def test_errors_are_typed_as_torch_expects() -> None:
    assert issubclass(PeerFailureError, torch_dist.DistBackendError)
    assert issubclass(PeerFailureError, CommError)
    assert issubclass(CollectiveMismatchError, ValueError)
    error = PeerFailureError("x", failed_rank=3, op="all_reduce", group="dp")
    assert (error.failed_rank, error.op, error.group) == (3, "all_reduce", "dp")


def test_recorder_numbers_collectives_and_p2p_separately_and_wraps() -> None:
    recorder = FlightRecorder("dp", (0, 1), capacity=3)
    tensor = torch.ones(2, 3)
    entries = [recorder.enter("all_reduce", tensor) for _ in range(4)]
    recorder.enter("send", tensor)
    mark_completed(entries[-1])
    snapshot = recorder.snapshot()
    collectives = [entry for entry in snapshot if not entry["op"].startswith("p2p:")]
    assert [entry["seq"] for entry in collectives] == [2, 3, 4]  # the ring keeps the last 3
    assert [entry["state"] for entry in collectives] == ["started", "started", "completed"]
    assert collectives[-1]["shape"] == [2, 3] and collectives[-1]["dtype"] == "float32"
    p2p = [entry for entry in snapshot if entry["op"].startswith("p2p:")]
    assert [(entry["op"], entry["seq"]) for entry in p2p] == [("p2p:send", 1)]
    assert recorder.to_json()["last_collective"] == 4


class _Failed(Exception):
    pass


def _fail(error: Exception):
    raise _Failed(str(error)) from error


def _start(async_op: bool, output: torch.Tensor, tensor: torch.Tensor):
    """Recording.fast_path's body: raises on an empty input, else the async op's Work, or for a
    sync op one to wait for (None when the output is empty: done already)."""
    if tensor.numel() == 0:
        raise RuntimeError("peer gone")
    return CompletedWork() if async_op or output.numel() else None


def _method(output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool):
    """A backend op method: always a Work."""
    return _start(True, output, tensor)


def _plan_run(async_op: bool, output: torch.Tensor, tensor: torch.Tensor):
    """A plan's run: the async op's Work, None once a sync op is done."""
    work = _start(True, output, tensor)
    if async_op:
        return work
    work.wait()
    return None


@pytest.mark.parametrize("kind", ["fast_path", "method_fast_path", "recorded"])
def test_every_recording_fast_path_enters_tracks_completes_and_fails_alike(kind: str) -> None:
    """The entry protocol's three Python forms: the entry describes the payload tensor, a sync
    call completes it, an async one tracks its Work weakly, and an error goes to ``fail``."""
    recorder = FlightRecorder("dp", (0, 1), capacity=8)
    if kind == "recorded":
        run = recorder.recorded("all_gather_into_tensor", -1, 1, _plan_run, _fail)
    else:
        recording = recorder.recording("all_gather_into_tensor", torch.float32, -1, _fail)
        if kind == "fast_path":
            run = recording.fast_path(1, _start)
            assert run.__module__ == __name__ and run.__wrapped__ is _start
        else:
            run = recording.method_fast_path(1, _method, ())
    assert run(False, torch.ones(4), torch.ones(2)) is None
    assert run(False, torch.empty(0), torch.ones(2)) is None
    work = run(True, torch.ones(4), torch.ones(2))
    with pytest.raises(_Failed, match="peer gone"):
        run(False, torch.ones(4), torch.empty(0))
    entries = recorder.snapshot()
    assert [(entry["seq"], entry["shape"], entry["dtype"]) for entry in entries] == [
        (1, [2], "float32"),
        (2, [2], "float32"),
        (3, [2], "float32"),
        (4, [0], "float32"),
    ]
    assert [entry["state"] for entry in entries] == ["completed", "completed", "completed", "started"]
    assert all(entry["completed_ns"] >= entry["queued_ns"] > 0 for entry in entries[:2])
    assert recorder.op_of(work) == "all_gather_into_tensor" and entries[2]["completed_ns"] is None


def test_a_prefilled_ring_keeps_distinct_blanks_that_no_reader_reports() -> None:
    recorder = FlightRecorder("dp", (0, 1), capacity=4)
    work = CompletedWork()
    track(recorder.enter("all_reduce", torch.ones(3)), work)
    ring = recorder.recording("all_reduce", torch.float32, -1, lambda error: None).ring
    prefill(ring)
    blanks = [entry for entry in ring if entry[0] == 0]
    assert len(blanks) == 3 and len({id(entry) for entry in blanks}) == 3  # rewritable one by one
    assert [entry["seq"] for entry in recorder.snapshot()] == [1]
    assert recorder.to_json()["last_collective"] == 1 and recorder.op_of(work) == "all_reduce"
    assert recorder.op_of(CompletedWork()) is None


def test_recorder_reads_async_state_through_a_weak_reference() -> None:
    recorder = FlightRecorder("world", (0,))
    kept, dropped = CompletedWork(), CompletedWork()
    track(recorder.enter("broadcast", [torch.ones(1), torch.ones(2)], root=0), kept)
    track(recorder.enter("all_reduce", torch.ones(1)), dropped)
    del dropped
    gc.collect()
    states = {entry["op"]: entry for entry in recorder.snapshot()}
    assert states["broadcast"]["state"] == "completed" and states["broadcast"]["shape"] == [[1], [2]]
    assert states["broadcast"]["root"] == 0
    assert states["all_reduce"]["state"] == "released"


def test_describe_call_is_what_the_mismatch_error_shows() -> None:
    entry = FlightRecorder("g", (0, 1)).enter("reduce", torch.zeros(4, 2, dtype=torch.int32), root=1)
    assert describe_call(entry) == "reduce(int32[4, 2], root 1)"


def _dump(rank: int, entries: list[tuple[int, str, list[int], str]], reason: str = "") -> dict:
    rows = [
        {"seq": seq, "op": op, "shape": shape, "dtype": "float32", "root": -1, "state": state}
        for seq, op, shape, state in entries
    ]
    last = max((seq for seq, op, _, _ in entries if not op.startswith("p2p:")), default=0)
    group = {"group": "dp", "ranks": [0, 1, 2, 3], "last_collective": last, "entries": rows}
    return {"rank": rank, "world_size": 4, "reason": reason, "groups": [group]}


def test_analysis_names_the_rank_that_never_entered_and_those_waiting(tmp_path: Path) -> None:
    waiting = [(1233, "broadcast", [4], "completed"), (1234, "all_reduce", [4], "started")]
    stuck = [(1233, "broadcast", [4], "completed")]
    for rank, entries in {0: waiting, 1: waiting, 2: stuck, 3: waiting}.items():
        write_dump(tmp_path, rank, _dump(rank, entries, "SIGUSR1"))
    text = "\n".join(analyze(load_dumps(tmp_path)))
    assert "rank 2 never entered all_reduce #1234" in text, text
    assert "ranks 0, 1, 3 are waiting in all_reduce #1234" in text, text
    assert "rank 2's last collective there was broadcast #1233" in text, text


def test_analysis_reports_a_mismatch_and_missing_dumps(tmp_path: Path) -> None:
    write_dump(tmp_path, 0, _dump(0, [(7, "all_reduce", [4], "started")]))
    write_dump(tmp_path, 1, _dump(1, [(7, "all_reduce", [8], "started")]))
    text = "\n".join(analyze(load_dumps(tmp_path)))
    assert "MISMATCH at collective #7" in text and "[8]" in text, text
    assert "no dump from ranks 2, 3" in text, text


def test_trace_cli_reads_a_directory_and_names_a_bad_one(tmp_path: Path, capsys) -> None:
    write_dump(tmp_path, 0, _dump(0, [(1, "all_reduce", [4], "completed")]))
    assert cli_main(["trace", "analyze", str(tmp_path)]) == 0
    assert "completed collective #1" in capsys.readouterr().out
    (tmp_path / "rank1.json").write_text("{not json")
    assert cli_main(["trace", "analyze", str(tmp_path)]) == 2
    assert "rank1.json" in capsys.readouterr().err


def test_debug_mode_follows_commlayer_and_torch_variables() -> None:
    assert debug_mode({"COMMLAYER_DEBUG": "detail"})
    assert debug_mode({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert not debug_mode({"TORCH_DISTRIBUTED_DEBUG": "INFO"})
    assert not debug_mode({})


def _group() -> ProcessGroup:
    return ProcessGroup("dp", (0, 1, 2), 1, {}, "gloo", timedelta(seconds=5))


def test_translate_names_op_group_and_rank_for_raw_library_errors() -> None:
    group = _group()
    timeout = translate(group, "all_reduce", RuntimeError("[gloo] Timed out waiting 5000ms for recv"))
    assert isinstance(timeout, CommTimeoutError)
    assert "all_reduce on group 'dp'" in str(timeout) and "(rank 1)" in str(timeout)
    health.report(2, "no heartbeat for 5.0 s")
    lost = translate(group, "broadcast", RuntimeError("Connection reset by peer [127.0.0.1]:1234. GLHF!"))
    assert isinstance(lost, PeerFailureError) and lost.failed_rank == 2
    assert "peer rank 2 failed" in str(lost) and "broadcast on group 'dp'" in str(lost)
    bad = ValueError("not a comm error")
    assert translate(group, "all_reduce", bad) is bad


def test_an_aborted_group_fails_every_later_op_at_once() -> None:
    group = _group()
    abort_group(group, PeerFailureError("gone", failed_rank=2))
    with pytest.raises(PeerFailureError, match="cannot be used after peer rank 2 failed") as raised:
        group.op_calls.get(("all_reduce", None))
    assert "(rank 1)" in str(raised.value)
    abort_group(group, CommTimeoutError("slow"))
    with pytest.raises(CommError, match="cannot be used after an op timed out"):
        group.op_calls.get(("barrier", None))


def test_health_reports_the_first_failure_once_to_listeners() -> None:
    seen = []
    listener = seen.append
    health.add_listener(listener)
    try:
        health.report(3, "killed")
        health.report(1, "later")
        assert [failure.rank for failure in seen] == [3]
        with pytest.raises(PeerFailureError, match="peer rank 3 failed"):
            health.raise_if_failed("barrier", "world", 0)
    finally:
        health._listeners.remove(listener)


def test_write_dump_is_json(tmp_path: Path) -> None:
    path = write_dump(tmp_path / "new", 5, {"rank": 5})
    assert json.loads(path.read_text()) == {"rank": 5} and path.name == "rank5.json"


def test_a_one_tensor_fast_path_enters_and_completes_like_the_general_one() -> None:
    recorder = FlightRecorder("dp", (0, 1), capacity=4)
    recording = recorder.recording("broadcast", torch.float32, 1, _fail)
    run = recording.fast_path(0, lambda async_op, tensor: _start(async_op, tensor, tensor), one_tensor=True)
    assert run(False, torch.ones(3)) is None
    work = run(True, torch.ones(3))
    with pytest.raises(_Failed, match="peer gone"):
        run(False, torch.empty(0))
    entries = recorder.snapshot()
    assert [(entry["shape"], entry["root"], entry["state"]) for entry in entries] == [
        ([3], 1, "completed"),
        ([3], 1, "completed"),
        ([0], 1, "started"),
    ]
    assert recorder.op_of(work) == "broadcast"
