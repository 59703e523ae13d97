"""Pure logic: peermem's C fast path (``KernelPath``) on the CPU, against what its Python twin does.

No GPU here, so the CUDA kernel library's ``pm_launch`` and ``pm_all_to_all`` are stood in for by
ctypes callbacks of the same signatures (doubles, named as such: they record the calls), the current stream by a callable and
the route table by the twin's own ``route_verdict``. CPU tensors take the place of CUDA ones through
the device type and index the path is built for. What the real kernels do with the call is checked
on the GPU machine (``benchmarks/gpu/peermem.py``, which runs with and without the C fast paths).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
from typing import Any, NoReturn

import pytest
import torch

from commlayer.backends.peermem import fast_path
from commlayer.backends.peermem.communicator import Route
from commlayer.backends.peermem.ordering import StreamOrder
from commlayer.backends.peermem.splits import MAX_RANKS, byte_splits
from commlayer.core.errors import CommError
from commlayer.core.flight_recorder import COMPLETED, STARTED, WORK, Recording, describe_entry
from commlayer.core.work import CompletedWork

native = fast_path.native
pytestmark = pytest.mark.skipif(native is None, reason="the peermem fast path extension is not built")

STREAM = 0x5EED
LAUNCH_ARGUMENTS = (
    ctypes.c_int,  # returned
    *(ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int),
    *(ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_int),
)
LaunchFunction = ctypes.CFUNCTYPE(*LAUNCH_ARGUMENTS)
EXCHANGE_ARGUMENTS = (
    ctypes.c_int,  # returned
    *(
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_ulonglong,
        ctypes.POINTER(ctypes.c_ulonglong),
    ),
    *(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_ulonglong),
)
ExchangeFunction = ctypes.CFUNCTYPE(*EXCHANGE_ARGUMENTS)
PUSH_BYTES = 512 << 10


class Translated(CommError):
    pass


def _fail(error: Exception) -> NoReturn:
    raise Translated(f"collective failed: {error}") from error


class KernelDouble:
    """Stands for the kernel library's pm_launch (or, for all_to_all_single, pm_all_to_all, whose
    split table it copies while the call lasts): records each launch and returns ``rc``."""

    def __init__(self, exchange: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.rc = 0
        self.function = ExchangeFunction(self._exchange) if exchange else LaunchFunction(self._launch)

    def _launch(self, *arguments: Any) -> int:
        self.calls.append(arguments)
        return self.rc

    def _exchange(self, handle: int, source: int, output: int, nbytes: int, splits: Any, *rest: Any) -> int:
        return self._launch(handle, source, output, nbytes, list(splits[: 4 * MAX_RANKS]), *rest)

    @property
    def address(self) -> int:
        return ctypes.cast(self.function, ctypes.c_void_p).value


class Harness:
    """One KernelPath with every collaborator recording what it is asked."""

    def __init__(self, op: str, routes: dict[int, Route | None], async_bytes: int = 1 << 20) -> None:
        self.kernel = KernelDouble(exchange=op == "all_to_all_single")
        self.handle: int | None = 0xC0FFEE  # PeerComm's: None once the group's region is freed
        self.failed = ctypes.c_int(0)
        self.stream = STREAM
        self.capturing = False
        self.joined: list[tuple[int, int]] = []  # (waiting stream, stream waited for)
        self.order = StreamOrder(lambda: self.stream, lambda: self.capturing, self._join)
        self.order.stream()  # the group's last kernel went to STREAM
        self.routes, self.asked, self.handed = routes, [], []
        self.placed: list[tuple[str, int, int]] = []  # (op, source pointer, output pointer) asked to place
        self.places_error: Exception | None = None
        self.ring: list = [None] * 8
        self.verdicts: dict[int, Any] = {}  # the group's table of this op's routes (PeerComm.verdict_table)
        recording = Recording(itertools.count(1).__next__, self.ring, 8, op, torch.float32, -1, _fail)
        self.path = native.KernelPath(
            op=fast_path.KERNEL_OPS[op],
            device_type=torch_device_type(),
            device=-1,
            world=4,
            async_bytes=async_bytes,
            default_stream=STREAM,  # the harness issues from the default stream unless a test moves it
            launch=self.kernel.address,
            handle=0xC0FFEE,
            failed=ctypes.addressof(self.failed),
            comm=self,
            places=functools.partial(self._places, op),
            route_of=self._route_of,
            order=self.order,
            raw_stream=lambda device: self.stream,
            nccl=lambda *call: self.handed.append(("nccl", *call)),
            twin=lambda *call: self.handed.append(("twin", *call)),
            started_work=lambda output: CompletedWork((output,)),
            launch_failed=self._launch_failed,
            raise_failed=self._raise_failed,
            recording=recording,
            push_bytes=PUSH_BYTES,
            routes=self.verdicts,
        )

    def _join(self, waiting: int, after: int) -> None:
        if waiting < 0:
            raise RuntimeError("peermem: cudaStreamWaitEvent failed")
        self.joined.append((waiting, after))

    def _route_of(self, tensor: torch.Tensor) -> fast_path.Verdict:
        nbytes = tensor.numel() * tensor.element_size()
        self.asked.append(nbytes)
        return fast_path.route_verdict(self.routes.get(nbytes))

    def _places(self, op: str, source: torch.Tensor, output: torch.Tensor) -> tuple[int, int, int, int, int]:
        """Stands for PeerComm.places: the input in slot 3, the output in slot 5, at fixed offsets."""
        self.placed.append((op, source.data_ptr(), output.data_ptr()))
        if self.places_error is not None:
            raise self.places_error
        return 3, 5, 0x100, 0x200, -1

    def _launch_failed(self, rc: int) -> NoReturn:
        raise RuntimeError(f"peermem: kernel launch failed: error {rc}")

    def _raise_failed(self) -> NoReturn:
        raise TimeoutError("peermem wait: group rank 2 did not reach a collective")


def torch_device_type() -> int:
    from commlayer.core import _tensor_meta

    return _tensor_meta.describe(torch.ones(1))[1]


STAGED = Route(code=0x21, blocks=24, op="")
ZERO_COPY = Route(code=0x27, blocks=64, op="all_reduce")


def test_a_staged_route_launches_with_the_callers_pointers_and_stream_and_enters_the_call() -> None:
    tensor = torch.arange(64.0).reshape(8, 8)
    harness = Harness("all_reduce", {256: STAGED})
    assert harness.path(False, tensor) is None
    handle, code, source, output, nbytes, blocks, stream, *placed = harness.kernel.calls.pop()
    assert (handle, code, blocks, stream) == (0xC0FFEE, 0x21, 24, STREAM)
    assert source == output == tensor.data_ptr() and nbytes == 256
    assert placed == [-1, -1, 0, 0, -1]  # unplaced: the staging region
    entry = harness.ring[1]
    assert entry[:6] == [1, "all_reduce", (8, 8), torch.float32, -1, COMPLETED] and entry[WORK] is None
    assert harness.handed == []


@pytest.mark.parametrize("op", ["all_gather_into_tensor", "reduce_scatter_tensor"])
def test_the_paired_ops_pass_the_input_as_source_and_a_ranks_share_as_bytes(op: str) -> None:
    small, large = torch.arange(16.0), torch.arange(64.0)
    output, tensor = (large, small) if op == "all_gather_into_tensor" else (small, large)
    harness = Harness(op, {256: STAGED})
    assert harness.path(False, output, tensor) is None
    _, _, source, target, nbytes, *_ = harness.kernel.calls.pop()
    assert (source, target, nbytes) == (tensor.data_ptr(), output.data_ptr(), 64)
    assert harness.ring[1][2] == (64,)  # the entry describes the larger tensor, as the twin's does


def test_each_size_and_dtype_is_routed_once() -> None:
    harness = Harness("all_reduce", {256: STAGED, 1024: None})
    for _ in range(3):
        harness.path(False, torch.ones(64))
        harness.path(False, torch.ones(256))
        harness.path(False, torch.ones(128, dtype=torch.float16))
    assert sorted(harness.asked) == [256, 256, 1024]
    assert len(harness.path.routes) == 3 and len(harness.kernel.calls) == 6


def test_routes_are_cached_in_the_groups_table_and_asked_again_once_it_is_emptied() -> None:
    harness = Harness("all_reduce", {256: None})
    harness.path(False, torch.ones(64))
    assert harness.verdicts == {256 << 8 | 6: None} and harness.handed[-1][0] == "nccl"
    harness.routes[256] = STAGED  # a forced algorithm: PeerComm.force empties the table
    harness.path(False, torch.ones(64))
    assert harness.kernel.calls == []  # still the cached route
    harness.verdicts.clear()
    harness.path(False, torch.ones(64))
    assert harness.asked == [256, 256] and harness.kernel.calls.pop()[1] == STAGED.code


def test_the_sizes_nccl_serves_go_to_ncclss_fast_path_with_the_same_arguments() -> None:
    tensor = torch.ones(256)
    harness = Harness("all_reduce", {})
    assert harness.path(True, tensor) is None
    assert harness.handed == [("nccl", True, tensor)] and harness.kernel.calls == []


def test_a_zero_copy_route_launches_with_the_places_the_registry_gives() -> None:
    tensor = torch.arange(64.0)
    harness = Harness("all_reduce", {256: ZERO_COPY})
    assert harness.path(False, tensor) is None
    assert harness.placed == [("all_reduce", tensor.data_ptr(), tensor.data_ptr())]
    _, code, source, output, nbytes, blocks, stream, *placed = harness.kernel.calls.pop()
    assert (code, blocks, stream, nbytes) == (0x27, 64, STREAM, 256)
    assert source == output == tensor.data_ptr() and placed == [3, 5, 0x100, 0x200, -1]
    assert harness.ring[1][5] == COMPLETED and harness.handed == []


@pytest.mark.parametrize("op", ["all_gather_into_tensor", "reduce_scatter_tensor"])
def test_a_zero_copy_paired_op_places_its_input_as_source(op: str) -> None:
    small, large = torch.arange(16.0), torch.arange(64.0)
    output, tensor = (large, small) if op == "all_gather_into_tensor" else (small, large)
    harness = Harness(op, {256: Route(code=0x28, blocks=8, op=op)})
    assert harness.path(False, output, tensor) is None
    assert harness.placed == [(op, tensor.data_ptr(), output.data_ptr())]
    assert harness.kernel.calls.pop()[7:] == (3, 5, 0x100, 0x200, -1)


def test_a_placing_error_fails_the_entered_call_and_launches_nothing() -> None:
    harness = Harness("all_reduce", {256: ZERO_COPY})
    harness.places_error = ValueError("segment table full")
    with pytest.raises(Translated, match="segment table full"):
        harness.path(False, torch.ones(64))
    assert harness.kernel.calls == [] and harness.ring[1][5] == STARTED


def _handed_to_twin(harness: Harness, *call: Any) -> bool:
    harness.handed.clear()
    harness.path(*call)
    return harness.handed == [("twin", *call)] and harness.kernel.calls == []


def test_what_needs_python_goes_to_the_twin() -> None:
    harness = Harness("all_reduce", {64: STAGED}, async_bytes=64)
    assert _handed_to_twin(harness, True, torch.ones(16))  # large async from the default stream: it moves
    assert _handed_to_twin(harness, False, torch.ones(17)[1:])  # not 16-byte aligned
    assert _handed_to_twin(harness, False, torch.ones(4, 8).t())  # not contiguous
    assert _handed_to_twin(harness, False, torch.ones(16).as_subclass(Subclass))  # unread
    harness.handle = None
    assert _handed_to_twin(harness, False, torch.ones(16))  # the group is gone: its methods say so
    paired = Harness("all_gather_into_tensor", {256: STAGED})
    assert _handed_to_twin(paired, False, torch.ones(64), torch.ones(16, dtype=torch.float64))


class Subclass(torch.Tensor):
    pass


def test_a_large_async_call_from_a_stream_of_the_callers_own_launches_there() -> None:
    harness = Harness("all_reduce", {64: STAGED}, async_bytes=64)
    harness.stream = STREAM + 1  # as DeepSpeed's ZeRO-3 and FSDP2 issue theirs
    work = harness.path(True, torch.ones(16))
    assert isinstance(work, CompletedWork) and harness.handed == []
    assert harness.kernel.calls.pop()[6] == STREAM + 1 and harness.joined == [(STREAM + 1, STREAM)]


def test_a_call_on_another_stream_waits_for_the_groups_last_kernel_then_launches() -> None:
    harness = Harness("all_reduce", {64: STAGED})
    harness.stream = STREAM + 1
    assert harness.path(False, torch.ones(16)) is None and harness.handed == []
    assert harness.kernel.calls.pop()[6] == STREAM + 1 and harness.order.last == STREAM + 1
    assert harness.joined == [(STREAM + 1, STREAM)]
    harness.path(False, torch.ones(16))  # the same stream again: no more joins
    assert len(harness.joined) == 1 and len(harness.kernel.calls) == 1


def test_after_a_capture_the_next_stream_starts_a_new_order_without_a_join() -> None:
    harness = Harness("all_reduce", {64: STAGED})
    harness.capturing, harness.stream = True, STREAM + 1
    harness.path(False, torch.ones(16))  # captured: launched there, no wait on outside work
    assert harness.kernel.calls.pop()[6] == STREAM + 1 and harness.order.last is None
    harness.capturing, harness.stream = False, STREAM + 2
    harness.path(False, torch.ones(16))
    assert harness.kernel.calls.pop()[6] == STREAM + 2 and harness.order.last == STREAM + 2
    assert harness.joined == [] and harness.handed == []


def test_a_failing_join_fails_the_entered_call_and_launches_nothing() -> None:
    harness = Harness("all_reduce", {64: STAGED})
    harness.stream = -1  # a stream the join fails on
    with pytest.raises(Translated, match="cudaStreamWaitEvent failed"):
        harness.path(False, torch.ones(16))
    assert harness.kernel.calls == [] and harness.ring[1][5] == STARTED


def test_an_async_call_returns_the_started_work_tracked_weakly() -> None:
    tensor = torch.ones(16)
    harness = Harness("all_reduce", {64: STAGED})
    work = harness.path(True, tensor)
    assert isinstance(work, CompletedWork) and work.result()[0] is tensor
    assert harness.ring[1][5] == STARTED and harness.ring[1][WORK]() is work
    assert describe_entry(harness.ring[1])["state"] == COMPLETED  # as the Work says


def test_a_failed_launch_and_a_peers_timeout_raise_through_the_recordings_fail() -> None:
    harness = Harness("all_reduce", {64: STAGED})
    harness.kernel.rc = 700
    with pytest.raises(Translated, match="kernel launch failed: error 700"):
        harness.path(False, torch.ones(16))
    assert harness.ring[1][5] == STARTED  # entered, never completed: what a dump must show
    harness.kernel.rc = 0
    harness.failed.value = 1
    with pytest.raises(Translated, match="group rank 2 did not reach") as raised:
        harness.path(False, torch.ones(16))
    assert isinstance(raised.value.__cause__, TimeoutError) and harness.ring[2][5] == STARTED


def test_a_wrong_call_names_the_op_and_what_it_expected() -> None:
    harness = Harness("reduce_scatter_tensor", {})
    with pytest.raises(TypeError, match="reduce_scatter_tensor: expected \\(async_op, output, input\\)"):
        harness.path(False, torch.ones(4))
    exchange = Harness("all_to_all_single", {})
    with pytest.raises(
        TypeError, match="expected \\(async_op, output, input, output_splits, input_splits\\)"
    ):
        exchange.path(False, torch.ones(4), torch.ones(4))


def test_routes_map_to_what_the_c_path_does() -> None:
    assert fast_path.route_verdict(None) is None
    assert fast_path.route_verdict(ZERO_COPY) == (0x27, 64, True)
    assert fast_path.route_verdict(STAGED) == (0x21, 24)


def test_the_twin_serves_when_c_fast_paths_are_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMLAYER_C_FAST_PATHS", "0")
    assert fast_path.kernel_path(None, "all_reduce", (None,), None, print, print) is None  # type: ignore[arg-type]
    monkeypatch.delenv("COMMLAYER_C_FAST_PATHS")
    assert fast_path.kernel_path(None, "broadcast", (0,), None, print, print) is None  # type: ignore[arg-type]


EXCHANGE = Route(code=0, blocks=64, op="all_to_all_single")


def _exchange(rows: int, splits: tuple[Any, Any] = (None, None), async_op: bool = False) -> tuple[Any, ...]:
    """Harness and the launch of one all_to_all_single of ``rows`` x 4 floats each way."""
    output, source = torch.zeros(rows, 4), torch.arange(rows * 4.0).reshape(rows, 4)
    harness = Harness("all_to_all_single", {rows * 16: EXCHANGE})
    returned = harness.path(async_op, output, source, *splits)
    return harness, returned, output, source


@pytest.mark.parametrize(
    "splits",
    [(None, None), ([1, 2, 3, 2], [2, 2, 0, 4]), ((0, 0, 8, 0), (8, 0, 0, 0)), ([2, 2, 2, 2], None)],
    ids=["even", "uneven lists", "one peer each way, tuples", "one side listed"],
)
def test_all_to_all_launches_the_split_table_the_twin_would_pack(splits: tuple[Any, Any]) -> None:
    harness, returned, output, source = _exchange(8, splits)
    assert returned is None and harness.handed == []
    handle, given, target, nbytes, table, blocks, stream, in_slot, in_off, descriptor, push = (
        harness.kernel.calls.pop()
    )
    assert (handle, given, target, nbytes) == (0xC0FFEE, source.data_ptr(), output.data_ptr(), 128)
    assert table == byte_splits(source, output, splits[1], splits[0], 4)
    assert (blocks, stream, in_slot, in_off, descriptor, push) == (64, STREAM, 3, 0x100, -1, PUSH_BYTES)
    assert harness.placed == [("all_to_all_single", source.data_ptr(), output.data_ptr())]
    assert harness.ring[1][:6] == [1, "all_to_all_single", (8, 4), torch.float32, -1, COMPLETED]


def test_an_async_all_to_all_returns_the_started_work_on_its_output() -> None:
    harness, work, output, _ = _exchange(8, async_op=True)
    assert work.result()[0] is output and harness.ring[1][WORK]() is work


def test_all_to_all_splits_the_c_path_cannot_read_go_to_the_twin() -> None:
    output, source = torch.zeros(8, 4), torch.ones(8, 4)
    harness = Harness("all_to_all_single", {128: EXCHANGE}, async_bytes=128)
    assert _handed_to_twin(harness, False, output, source, [2, 2, 4], None)  # not one per peer
    assert _handed_to_twin(harness, False, output, source, None, [2, 2, 2.0, 2])  # not ints
    assert _handed_to_twin(harness, False, output, source, None, torch.tensor([2, 2, 2, 2]))
    assert _handed_to_twin(harness, False, output, source, [2, 2, -2, 6], None)  # the twin names it
    assert _handed_to_twin(harness, True, output, source, None, None)  # large async: may move streams
    assert _handed_to_twin(harness, False, output, source.double(), None, None)
