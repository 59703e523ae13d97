"""Pure logic and wiring of the default-mode reliability checks: the mpi signature packing and its
comparison, the ordered-mode watchdog, the bounded store connection, shm's peer-exit translation."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from array import array
from datetime import timedelta

import pytest
import torch
import torch.distributed as torch_dist

from commlayer.backends.gloo import SignedProcessGroup
from commlayer.backends.mpi.ordered import OrderedExecutor
from commlayer.backends.mpi.signature import SignatureCheck
from commlayer.contract.mismatch import Members, ReductionCheck, split_counts
from commlayer.contract.mismatch.signature import describe_key
from commlayer.core import health, settings
from commlayer.core.errors import CollectiveMismatchError, CommError, CommTimeoutError, PeerFailureError
from commlayer.core.types import ReduceOp
from commlayer.core.work import WaitLimit
from commlayer.facade.calls.failures import translate
from commlayer.facade.groups.group import ProcessGroup
from commlayer.facade.lifecycle.init_method import _bounded

DTYPES = (torch.float32, torch.int32, torch.float64, torch.int64, torch.bfloat16)


def _check(rank: int = 0) -> SignatureCheck:
    """mpi's check of a 3-rank communicator whose global ranks are 10, 11, 12; its second exchange
    (the gathered calls after a mismatch) answers from ``_CALLS``."""

    def gathered(values: array) -> None:
        for index, (key, count) in enumerate(_CALLS):
            values[2 * index], values[2 * index + 1] = key, count

    codes = {dtype: code + 1 for code, dtype in enumerate(sorted(DTYPES, key=str))}
    return SignatureCheck(gathered, gathered, codes, "dp", (10, 11, 12), rank)


_CALLS: list[tuple[int, int]] = []


def _group_max(*contributions: tuple[int, int]) -> array:
    """What Allreduce(MAX) of each rank's ``[key, -key, count, -count]`` leaves on every rank."""
    rows = [(key, -key, count, -count) for key, count in contributions]
    _CALLS[:] = contributions
    return array("q", (max(column) for column in zip(*rows)))


def test_every_difference_ranks_can_make_changes_the_key() -> None:
    check, tensor = _check(), torch.zeros(4)
    keys = {
        check.key("all_reduce", tensor, reduce_op=ReduceOp.SUM),
        check.key("all_reduce", tensor, reduce_op=ReduceOp.MAX),
        check.key("all_reduce", tensor.int(), reduce_op=ReduceOp.SUM),
        check.key("broadcast", tensor, root=0),
        check.key("broadcast", tensor, root=1),
        check.key("barrier", None),
    }
    assert len(keys) == 6
    key = check.key("broadcast", torch.zeros(2, dtype=torch.int64), root=3)
    assert describe_key(key, 2, check.dtype_codes) == "broadcast(int64[2], root 3)"


def test_equal_calls_pass_and_any_difference_raises_naming_the_first_differing_peer() -> None:
    key = _check().key("all_reduce", torch.zeros(4), reduce_op=ReduceOp.SUM)
    _check()._compare("all_reduce", key, 4, _group_max((key, 4), (key, 4), (key, 4)), None)
    peers = {0: 11, 1: 10, 2: 11}
    for rank, count in enumerate((4, 8, 4)):
        with pytest.raises(CollectiveMismatchError) as raised:
            _check(rank)._compare("all_reduce", key, count, _group_max((key, 4), (key, 8), (key, 4)), None)
        theirs = 8 if count == 4 else 4
        assert str(raised.value).startswith(
            f"all_reduce on group 'dp': the ranks called different collectives: rank {10 + rank} called "
            f"all_reduce(float32[{count}], op sum), peer rank {peers[rank]} called "
            f"all_reduce(float32[{theirs}], op sum); checked by mpi before any data moved"
        )
    int_key = _check().key("all_reduce", torch.zeros(4, dtype=torch.int32), reduce_op=ReduceOp.SUM)
    with pytest.raises(
        CollectiveMismatchError, match=r"called all_reduce\(float32.*called all_reduce\(int32"
    ):
        _check()._compare("all_reduce", key, 4, _group_max((key, 4), (int_key, 4)), None)


def test_gloo_check_is_on_unless_its_variable_says_off() -> None:
    assert settings.GLOO_VERIFY.value({}) and settings.GLOO_VERIFY.value({"COMMLAYER_GLOO_VERIFY": "1"})
    offs = ("0", "false", "OFF", " no ")
    assert not any(settings.GLOO_VERIFY.value({"COMMLAYER_GLOO_VERIFY": off}) for off in offs)


def test_verified_ops_on_a_real_gloo_group_of_one_run_and_keep_their_data() -> None:
    """Wiring: the signature reduction runs on the ProcessGroup (a group of one agrees with itself)
    before the fused launchers' proxy issues the data op, whose torch Work it returns."""
    process_group = torch_dist.ProcessGroupGloo(torch_dist.HashStore(), 0, 1, timedelta(seconds=10))
    check = ReductionCheck(process_group, Members("solo", (0,), 0), "gloo")
    proxy = SignedProcessGroup(check, process_group, "all_reduce", (ReduceOp.SUM,))
    tensor = torch.arange(4.0)
    assert proxy.allreduce([tensor], torch_dist.AllreduceOptions()).wait()
    assert torch.equal(tensor, torch.arange(4.0)) and proxy.send == process_group.send
    check.verify("broadcast", torch.float32, 4, root=0)
    check.verify_exchange("all_to_all", torch.float32, [4], [4])
    with pytest.raises(
        CollectiveMismatchError,
        match=r"rank 0 called all_to_all\(float32, expecting 5 from rank 0\), peer rank 0 called "
        r"all_to_all\(float32, sending 4 to rank 0\)",
    ):
        check.verify_exchange("all_to_all", torch.float32, [4], [5])


def test_split_counts_are_elements_per_peer_and_empty_splits_are_even() -> None:
    output, tensor = torch.zeros(5, 3), torch.zeros(4, 3)
    assert split_counts(output, tensor, [2, 3], [1, 3]) == ([3, 9], [6, 9])
    assert split_counts(output[:4], tensor, [], [1, 3]) == ([3, 9], [6, 6])


def test_watchdog_ends_the_job_naming_op_group_and_rank_when_a_blocking_call_outlives_the_timeout() -> None:
    ended: list[str] = []
    released = threading.Event()
    executor = OrderedExecutor("dp", lambda reason: (ended.append(reason), released.set()))
    limit = WaitLimit(0.2, 3, "MPI", group="dp")
    started = time.monotonic()
    executor.run(lambda: released.wait(5.0), (), "all_reduce", limit)  # a call that never completes
    assert time.monotonic() - started < 2.0
    assert len(ended) == 1 and ended[0].startswith("CommTimeoutError: all_reduce"), ended
    assert "(rank 3) on group 'dp'" in ended[0]
    executor.run(lambda: None, (), "broadcast", limit)  # a prompt call is not reported
    time.sleep(0.4)
    assert len(ended) == 1
    assert executor.close()


def test_a_store_that_never_answers_fails_at_the_timeout() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        started = time.monotonic()
        with pytest.raises(CommTimeoutError, match=r"did not answer within .* \(rank 2\)"):
            _bounded(lambda: time.sleep(3), "the store at 127.0.0.1", 2, timedelta(seconds=0.3))
        assert time.monotonic() - started < 2.0


def test_the_store_hosts_own_timeout_is_the_same_typed_error() -> None:
    """Found by the 200-run loop: rank 0's TCPStore gave up waiting for its clients a moment before
    the bounded wait did, and its raw DistStoreError reached the caller."""

    def host_gives_up() -> None:
        raise torch_dist.DistStoreError("Timed out after 3 seconds waiting for clients. 1/2 clients joined.")

    with pytest.raises(CommTimeoutError, match=r"did not answer .* \(rank 0\).* did not join"):
        _bounded(host_gives_up, "the store at 127.0.0.1:1", 0, timedelta(seconds=5))


_ABANDONED_CONNECT = """
import socket, sys
from datetime import timedelta
import torch.distributed as torch_dist
from commlayer.facade.lifecycle.init_method import _bounded
from commlayer.core.errors import CommTimeoutError
with socket.socket() as probe:  # a port nobody listens on: torch's client retries past its timeout
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
try:
    _bounded(lambda: torch_dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=1)),
             "the store", 1, timedelta(seconds=1))
except CommTimeoutError:
    sys.exit(3)
"""


def test_a_rank_that_gave_up_on_the_store_exits_with_its_error_not_an_abort() -> None:
    """Found by the 200-run loop: the abandoned connect thread, still inside torch's C++ when the
    interpreter finalized, aborted the process ("terminate called without an active exception")."""
    for _ in range(2):  # the abort came in about two runs of three
        done = subprocess.run(
            [sys.executable, "-c", _ABANDONED_CONNECT],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 3, done.stderr[-2000:]
        assert "terminate called" not in done.stderr


def test_a_backend_error_that_saw_a_peer_exit_becomes_a_peer_failure_naming_it() -> None:
    group = ProcessGroup("dp", (0, 1, 2), 1, {}, "shm", timedelta(seconds=5))
    health.clear()
    try:
        health.report(2, "rank 2 exited without calling destroy_process_group")
        shm_error = CommError(
            "all_reduce: shm group 'dp', rank 1: peer rank 2 (pid 7) exited while this rank waited"
        )
        failure = translate(group, "all_reduce", shm_error)
        assert isinstance(failure, PeerFailureError) and failure.failed_rank == 2
        other = CommError("all_reduce: shm group 'dp' is unusable after an earlier failure")
        assert translate(group, "all_reduce", other) is other
    finally:
        health.clear()


def test_an_op_on_a_destroyed_group_names_op_group_and_rank() -> None:
    from commlayer import dist
    from commlayer.core.errors import InvalidArgumentError

    dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.new_group([0])
        dist.all_reduce(torch.ones(2), group=group)
        dist.destroy_process_group(group)
        for op, call in {
            "all_reduce": lambda: dist.all_reduce(torch.ones(2), group=group),
            "barrier": lambda: dist.barrier(group=group),
        }.items():
            with pytest.raises(
                InvalidArgumentError, match=rf"^{op}: argument 'group' .*'{group.name}', destroyed"
            ):
                call()
    finally:
        dist.destroy_process_group()
