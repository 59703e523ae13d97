"""Per-call ``timeout=``: argument checks (pure logic), the keyword on every op (wiring) and real
two-rank worlds on every CPU backend where a peer never comes: CommTimeoutError names the op,
group and rank within 1.5x the timeout, far below the group's."""

from __future__ import annotations

import inspect
from datetime import timedelta

import pytest

from commlayer import dist
from commlayer.core.errors import InvalidArgumentError, InvalidTypeError
from commlayer.facade.calls.timeouts import checked_timeout
from commlayer.testing import mpirun_unavailable_reason, run_world

TARGET = "tests.facade.call_timeouts_ranks:peer_never_comes"
TIMED_OPS = [
    "all_reduce",
    "broadcast",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "all_gather_v",
    "reduce_scatter_v",
    "all_reduce_coalesced",
    "all_gather_coalesced",
]


def test_timeouts_are_seconds_or_timedeltas() -> None:
    assert checked_timeout("all_reduce", 2) == 2.0
    assert checked_timeout("all_reduce", timedelta(milliseconds=250)) == 0.25
    with pytest.raises(InvalidTypeError, match="'timeout' expected a datetime.timedelta or seconds"):
        checked_timeout("all_reduce", True)
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgumentError, match="expected a positive duration"):
            checked_timeout("all_reduce", bad)


@pytest.mark.parametrize("op", TIMED_OPS)
def test_every_op_takes_a_keyword_only_timeout_last(op: str) -> None:
    parameters = list(inspect.signature(getattr(dist, op)).parameters.values())
    assert parameters[-1].name == "timeout", op
    if op != "barrier":  # torch's barrier has no timeout; commlayer's took one positionally before
        assert parameters[-1].kind is inspect.Parameter.KEYWORD_ONLY, op


@pytest.mark.multirank
@pytest.mark.parametrize("backend", ["gloo", "shm"])
def test_a_call_whose_peer_never_comes_times_out(backend: str) -> None:
    run_world(TARGET, 2, backend=None, timeout=120, args=[backend])


@pytest.mark.multirank
@pytest.mark.mpi
def test_a_call_whose_peer_never_comes_times_out_on_mpi() -> None:
    reason = mpirun_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    run_world(TARGET, 2, backend=None, launcher="mpirun", timeout=120, args=["mpi"])


@pytest.mark.multirank
@pytest.mark.ccl
def test_a_call_whose_peer_never_comes_times_out_on_ccl() -> None:
    pytest.importorskip("commlayer.backends.ccl._C")
    run_world(TARGET, 2, backend=None, timeout=120, args=["ccl"])
