"""Pure logic of the peermem backend: routing, the fixed-order reference, codes shared with the
kernels, the build cache and registration. The kernels themselves run on GPU machines
(benchmarks/gpu/peermem.py); nothing here needs a device."""

from __future__ import annotations

import ctypes
import itertools
import re
from pathlib import Path
from types import SimpleNamespace
from typing import NoReturn

import pytest
import torch
import torch.distributed as torch_dist

import commlayer
from commlayer.backends.nccl import NcclBackend
from commlayer.backends.peermem import PeermemBackend, fast_path
from commlayer.backends.peermem import board as boards
from commlayer.backends.peermem.attach import _local_attach, duplicate_devices
from commlayer.backends.peermem.communicator import KINDS, OP_CODES, PeerComm, timeout_error
from commlayer.backends.peermem.kernel_library import SOURCE, SOURCES, cache_path
from commlayer.backends.peermem.reference import fixed_order_reduce, reference_reduce_scatter
from commlayer.backends.peermem.routing import (
    CROSSOVERS,
    KERNEL_DTYPES,
    MAX_BLOCKS,
    SLICE_BLOCKS,
    THREADS,
    WIDE_MAX_BLOCKS,
    choose,
    choose_uneven,
    fits,
    grid_blocks,
)
from commlayer.backends.peermem.splits import byte_splits
from commlayer.contract.selection import resolve_backend_spec
from commlayer.core.flight_recorder import Recording
from commlayer.core.types import GroupSpec, ReduceOp
from commlayer.core.work import CompletedWork

KiB, MiB, HALF = 1 << 10, 1 << 20, 32 << 20


def _sources() -> str:
    return "".join(path.read_text() for path in SOURCES)


def _enum(name: str) -> dict[str, int]:
    body = re.search(rf"enum {name} \{{([^}}]*)\}}", _sources()).group(1)
    return {key.strip(): int(value) for key, value in (item.split("=") for item in body.split(","))}


def test_python_codes_match_the_kernel_enums() -> None:
    kinds, ops, dtypes = _enum("Kind"), _enum("Op"), _enum("Dtype")
    assert KINDS == {
        ("all_reduce", "one_shot"): kinds["ONE_SHOT"],
        ("all_reduce", "two_shot"): kinds["TWO_SHOT"],
        ("all_reduce", "push"): kinds["TWO_SHOT_PUSH"],
        ("all_reduce", "one_shot_push"): kinds["ONE_SHOT_PUSH"],
        ("all_reduce", "zero_copy"): kinds["ALL_REDUCE_IN_PLACE"],
        ("all_gather_into_tensor", "one_shot"): kinds["ALL_GATHER"],
        ("all_gather_into_tensor", "zero_copy"): kinds["ALL_GATHER_IN_PLACE"],
        ("reduce_scatter_tensor", "one_shot"): kinds["REDUCE_SCATTER"],
        ("reduce_scatter_tensor", "push"): kinds["REDUCE_SCATTER_PUSH"],
        ("reduce_scatter_tensor", "zero_copy"): kinds["REDUCE_SCATTER_IN_PLACE"],
    }
    assert {op.name: code for op, code in OP_CODES.items()} == ops
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    assert {names[dtype]: code for dtype, code in KERNEL_DTYPES.items()} == dtypes
    limits = dict(re.findall(r"#define (MAX_BLOCKS|THREADS|MAX_SLOTS|MAX_RANKS) (\d+)", _sources()))
    assert int(limits["THREADS"]) == THREADS and int(limits["MAX_BLOCKS"]) >= max(MAX_BLOCKS, WIDE_MAX_BLOCKS)
    assert int(limits["MAX_SLOTS"]) == boards.MAX_SLOTS and int(limits["MAX_RANKS"]) == boards.MAX_RANKS
    assert SOURCES[0] == SOURCE and {path.name for path in SOURCES} >= {"common.cuh", "fused_norm.cuh"}


def test_choose_follows_the_table_then_nccl() -> None:
    rows = CROSSOVERS[4]["all_reduce"]
    for bound, algorithm in rows:
        assert choose(CROSSOVERS, "all_reduce", bound, 4, HALF) == algorithm
    assert choose(CROSSOVERS, "all_reduce", 16, 4, HALF) == rows[0][1]
    assert choose(CROSSOVERS, "all_reduce", rows[-1][0] + 16, 4, HALF) == "nccl"
    assert choose(CROSSOVERS, "all_reduce", CROSSOVERS[2]["all_reduce"][-1][0] + 16, 2, HALF) == "nccl"


def test_group_sizes_outside_the_table() -> None:
    assert choose(CROSSOVERS, "all_reduce", 4 * KiB, 1, HALF) == "nccl"
    # 3 ranks use the 2-rank rows, 8 ranks the 4-rank rows.
    assert choose(CROSSOVERS, "all_reduce", 4 * KiB, 3, HALF) == CROSSOVERS[2]["all_reduce"][0][1]
    assert choose(CROSSOVERS, "all_reduce", 4 * KiB, 8, HALF) == CROSSOVERS[4]["all_reduce"][0][1]


def test_unaligned_or_oversized_calls_go_to_nccl() -> None:
    assert choose(CROSSOVERS, "all_reduce", 18, 4, HALF) == "nccl"  # not whole 16-byte units
    assert choose(CROSSOVERS, "all_gather_into_tensor", 16, 4, HALF) == "nccl"  # 4-byte chunks
    assert choose(CROSSOVERS, "reduce_scatter_tensor", 64 * 4, 4, HALF) != "nccl"
    assert not fits("all_reduce", "one_shot", 2 * HALF, 4, HALF)
    assert fits("all_reduce", "two_shot", HALF, 4, HALF)
    assert not fits("all_reduce", "push", HALF, 4, HALF)  # push stages twice the tensor
    assert not fits("all_reduce", "one_shot_push", HALF // 2, 4, HALF)  # every rank's copy
    assert fits("all_gather_into_tensor", "one_shot", 4 * HALF, 4, HALF)
    assert not fits("all_reduce", "zero_copy", 0, 4, HALF)


def test_zero_copy_serves_any_size_in_rounds() -> None:
    for op in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
        assert fits(op, "zero_copy", 64 * HALF, 4, HALF)
        assert not fits(op, "zero_copy", 64 * HALF + 4, 4, HALF)
    assert fits("all_to_all_single", "zero_copy", 3, 4, HALF)  # the kernel copies any bytes


def test_all_to_all_takes_one_algorithm_per_group_whatever_the_splits() -> None:
    assert choose_uneven(CROSSOVERS, 2) == choose_uneven(CROSSOVERS, 3) == "zero_copy"
    assert choose_uneven(CROSSOVERS, 1) == "nccl"
    assert choose_uneven(CROSSOVERS, 4, forced="nccl") == "nccl"
    assert choose_uneven(CROSSOVERS, 4, forced="two_shot") == "zero_copy"


def _fail(error: Exception) -> NoReturn:
    raise error


def _group_kernels(forced: str | None) -> SimpleNamespace:
    """A group's communicator as recorded_plan and the C fast path read it (attaching needs GPUs);
    its launch function is any C function's address, never called here."""
    table = SimpleNamespace(table=CROSSOVERS, world=4, forced=forced)
    launch = ctypes.cast(ctypes.pythonapi.Py_IsInitialized, ctypes.c_void_p)
    never = print  # the collaborators the C path would call per call; no call is made here
    return SimpleNamespace(
        serves_all_to_all=lambda: PeerComm.serves_all_to_all(table),
        device=0,
        world=4,
        async_bytes=1 << 20,
        default_stream=0,
        handle=1,
        failed=ctypes.c_int(0),
        all_to_all_blocks=64,
        all_to_all_push_bytes=1 << 19,
        order=None,
        started_work=never,
        launch_failed=never,
        raise_if_failed=never,
        lib=SimpleNamespace(lib=SimpleNamespace(pm_all_to_all=launch)),
        placement=SimpleNamespace(places=never),
        verdict_table=lambda op, reduce_op: {},
    )


def test_forcing_an_algorithm_empties_every_cached_route_of_the_group() -> None:
    comm = PeerComm.__new__(PeerComm)  # routing alone: the state __init__ sets for it
    comm.table, comm.world, comm.half_bytes, comm.forced = CROSSOVERS, 4, HALF, None
    comm._routes, comm._verdicts = {}, {}
    table = comm.verdict_table("all_reduce", ReduceOp.SUM)
    assert comm.verdict_table("all_reduce", ReduceOp.SUM) is table
    assert comm.route("all_reduce", 4 * KiB, torch.bfloat16, ReduceOp.SUM).blocks == 1
    table[4 * KiB] = "cached by a C fast path"
    comm.force("nccl")
    assert table == {} and comm.route("all_reduce", 4 * KiB, torch.bfloat16, ReduceOp.SUM) is None
    comm.force(None)
    assert comm.route("all_reduce", 4 * KiB, torch.bfloat16, ReduceOp.SUM) is not None


def test_all_to_all_takes_ncclss_fast_path_or_the_kernels_whatever_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Wiring: gloo's ProcessGroup stands where NCCL's would (its fast path is built the same way)."""
    backend = PeermemBackend.__new__(PeermemBackend)
    backend._pg = torch_dist.ProcessGroupGloo(torch_dist.HashStore(), 0, 1)
    ring: list = [None] * 4
    recording = Recording(itertools.count(1).__next__, ring, 4, "all_to_all_single", torch.float32, -1, _fail)
    backend._comm = _group_kernels(forced=None)
    # A CPU build of torch has no CUDA stream reader; the path reads it per call only.
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 0, raising=False)
    plan = backend.recorded_plan("all_to_all_single", (), recording)
    if fast_path.native is not None:
        assert isinstance(plan, fast_path.native.KernelPath)
    monkeypatch.setenv("COMMLAYER_C_FAST_PATHS", "0")
    called = []
    monkeypatch.setattr(
        backend, "all_to_all_single", lambda *call, async_op: called.append(call) or CompletedWork(())
    )
    output, tensor = torch.empty(6), torch.arange(6.0)
    backend.recorded_plan("all_to_all_single", (), recording)(True, output, tensor, None, [1, 2, 3, 0])
    assert called == [(output, tensor, None, [1, 2, 3, 0])]  # the twin: the routing method
    backend._comm = _group_kernels(forced="nccl")
    backend.recorded_plan("all_to_all_single", (), recording)(False, output, tensor, None, None)
    assert torch.equal(output, tensor) and called == [(output, tensor, None, [1, 2, 3, 0])]
    assert len([entry for entry in ring if entry is not None]) == 2  # both entered in the flight recorder


def test_forced_algorithm_where_the_kernels_can_serve() -> None:
    assert choose(CROSSOVERS, "all_reduce", 64 * MiB, 4, 128 * MiB, forced="two_shot") == "two_shot"
    assert choose(CROSSOVERS, "all_gather_into_tensor", 4 * KiB, 4, HALF, forced="two_shot") == "one_shot"
    assert choose(CROSSOVERS, "all_gather_into_tensor", 4 * KiB, 4, HALF, forced="push") == "one_shot"
    assert choose(CROSSOVERS, "reduce_scatter_tensor", 4 * KiB, 4, HALF, forced="one_shot_push") == "one_shot"
    assert choose(CROSSOVERS, "reduce_scatter_tensor", 4 * KiB, 4, HALF, forced="push") == "push"
    assert choose(CROSSOVERS, "all_reduce", 18, 4, HALF, forced="one_shot") == "nccl"
    assert choose(CROSSOVERS, "all_reduce", 4 * KiB, 4, HALF, forced="nccl") == "nccl"


def test_grid_is_a_function_of_the_call_within_limits() -> None:
    assert grid_blocks("all_reduce", "one_shot", 16, 4) == 1
    assert grid_blocks("all_reduce", "one_shot", THREADS * 16 * 3, 4) == 3
    assert grid_blocks("all_reduce", "one_shot", 64 * MiB, 4) == MAX_BLOCKS
    assert grid_blocks("all_reduce", "push", 64 * MiB, 4) == WIDE_MAX_BLOCKS
    assert grid_blocks("all_reduce", "zero_copy", 64 * MiB, 2) == WIDE_MAX_BLOCKS
    assert grid_blocks("all_reduce", "zero_copy", 4 * MiB, 4) == WIDE_MAX_BLOCKS
    assert grid_blocks("all_reduce", "zero_copy", 4 * MiB + 64, 4) == SLICE_BLOCKS
    # Two-shot's grid covers one slice; a gather's and a scatter's one rank's chunk.
    assert grid_blocks("all_reduce", "two_shot", THREADS * 16 * 8, 4) == 2
    assert grid_blocks("reduce_scatter_tensor", "one_shot", THREADS * 16 * 8, 4) == 2


def test_reference_accumulates_in_float_in_rank_order() -> None:
    bf16 = [torch.tensor([256.0, 1.0], dtype=torch.bfloat16), torch.tensor([1.0, 2.0], dtype=torch.bfloat16)]
    bf16.append(torch.tensor([1.0, -3.0], dtype=torch.bfloat16))
    # In bfloat16 steps 256 + 1 rounds back to 256; in float the sum is 258, which bfloat16 holds.
    assert fixed_order_reduce(bf16, ReduceOp.SUM).tolist() == [258.0, 0.0]
    assert fixed_order_reduce(bf16, ReduceOp.AVG).tolist() == [86.0, 0.0]
    assert fixed_order_reduce(bf16, ReduceOp.MIN).tolist() == [1.0, -3.0]
    assert fixed_order_reduce(bf16, ReduceOp.MAX).tolist() == [256.0, 2.0]
    assert fixed_order_reduce(bf16, ReduceOp.PRODUCT).tolist() == [256.0, -6.0]
    assert fixed_order_reduce(bf16, ReduceOp.SUM).dtype == torch.bfloat16


def test_reference_order_is_rank_order_for_float32() -> None:
    big, small = torch.tensor([1e8], dtype=torch.float32), torch.tensor([1.0], dtype=torch.float32)
    # float32 addition is not associative (1e8 + 1 == 1e8), so the order is part of the result.
    assert fixed_order_reduce([big, small, -big, small], ReduceOp.SUM).item() == 1.0
    assert fixed_order_reduce([big, -big, small, small], ReduceOp.SUM).item() == 2.0


def test_reference_reduce_scatter_takes_the_rank_chunk() -> None:
    inputs = [torch.arange(8, dtype=torch.float32) + 10 * r for r in range(4)]
    assert reference_reduce_scatter(inputs, ReduceOp.SUM, 2).tolist() == [4 * 4 + 60.0, 4 * 5 + 60.0]
    with pytest.raises(ValueError, match="argument 'op'"):
        fixed_order_reduce(inputs, ReduceOp.BAND)


def test_cache_path_names_source_and_arch(tmp_path: Path) -> None:
    first = cache_path(b"a", "sm_90", str(tmp_path))
    assert first.parent == tmp_path and "sm_90" in first.name
    assert cache_path(b"b", "sm_90", str(tmp_path)) != first
    assert cache_path(b"a", "sm_80", str(tmp_path)) != first
    assert cache_path(b"a", "sm_90", str(tmp_path)) == first


def test_groups_the_kernels_cannot_serve_say_why() -> None:
    spec = GroupSpec(name="g", ranks=tuple(range(9)), global_rank=0, store=None)
    assert _local_attach(spec, HALF)[3].startswith("group of 9 ranks")
    single = GroupSpec(name="g", ranks=(0,), global_rank=0, store=None)
    assert _local_attach(single, HALF)[0] is None


def test_registered_and_chosen_by_default() -> None:
    rows = {info.name: info for info in commlayer.list_backends()}
    assert rows["peermem"].origin == "commlayer.backends.peermem:PeermemBackend"
    assert PeermemBackend.capabilities == NcclBackend.capabilities
    assert resolve_backend_spec(None, {}, "cuda") == "cpu:gloo,cuda:peermem"
    if not torch.cuda.is_available():
        assert "no CUDA device" in rows["peermem"].availability.reason


def test_a_missing_peer_is_named_in_a_typed_timeout() -> None:
    spec = GroupSpec(name="tp", ranks=(4, 6, 7), global_rank=7, store=None)
    error = timeout_error(spec, 1, "wait")
    assert isinstance(error, commlayer.core.errors.CommTimeoutError) and isinstance(error, TimeoutError)
    assert "group rank 1 (global rank 6)" in str(error) and "waiting rank 2" in str(error)


def test_ranks_on_one_gpu_are_refused_with_the_fix() -> None:
    assert duplicate_devices(["GPU-a", "GPU-b"]) == ""
    reason = duplicate_devices(["GPU-a", "GPU-b", "GPU-a"])
    assert "group ranks 0 and 2" in reason and "set_device(LOCAL_RANK)" in reason


def test_all_to_all_splits_in_bytes() -> None:
    source = torch.zeros(6, 4, dtype=torch.bfloat16)  # rows of 8 bytes
    output = torch.zeros(5, 4, dtype=torch.bfloat16)
    splits = byte_splits(source, output, [1, 5], [2, 3], 2)
    assert len(splits) == 32
    assert splits[0:2] == [0, 8] and splits[8:10] == [8, 40]  # send offsets, lengths
    assert splits[16:18] == [0, 16] and splits[24:26] == [16, 24]  # receive offsets, lengths
    even = byte_splits(torch.zeros(8), torch.zeros(8), None, None, 4)
    assert even[0:4] == [0, 8, 16, 24] and even[8:12] == [8] * 4 and even[4:8] == [0] * 4
