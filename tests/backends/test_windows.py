"""One-sided windows (``commlayer.window``): argument checks and the emulation's wire format,
the wiring of the backends' windows, and real worlds on shm, gloo, mpi (both MPIs) and ccl that
run the conformance kit's window checks and exactly checked stress runs of 2,000 random ops.
"""

from __future__ import annotations

import os

import pytest
import torch

import commlayer
from commlayer.backends.ccl.window import payload_spec
from commlayer.contract.backend import Backend
from commlayer.contract.emulated_windows import TwoSidedWindow
from commlayer.contract.registry import get_backend_class, list_backends
from commlayer.contract.window_messages import Header, Kind, channel, decode, encode, tag
from commlayer.contract.windows import WindowSpec
from commlayer.core.errors import InvalidArgumentError, InvalidTypeError
from commlayer.core.types import GroupSpec
from commlayer.testing import mpirun_unavailable_reason, run_world
from commlayer.windows.validate import check_dtypes_agree, check_peer, check_span, check_tensor

# --- pure logic --------------------------------------------------------------------------------


def test_headers_round_trip_and_corrupt_ones_are_refused() -> None:
    for header in (
        Header(Kind.PUT, 5, 7),
        Header(Kind.SIGNAL),
        Header(Kind.GET, 0, 1 << 40),
        Header(Kind.DRAINED),
    ):
        assert decode(encode(header)) == header
    with pytest.raises(ValueError, match="32 bytes"):
        decode(b"\x01")
    with pytest.raises(ValueError, match="corrupt"):
        decode(encode(Header(Kind.PUT, 0, 0))[:8] + (-1).to_bytes(8, "little", signed=True) * 3)


def test_tags_and_channels_are_distinct_per_window_and_pair() -> None:
    tags = {tag(index, seq) for index in range(50) for seq in range(100)}
    assert len(tags) == 5000 and min(tags) >= 1 << 24 and max(tags) < 1 << 31
    assert channel("g/window0", 0, 1) != channel("g/window0", 1, 0) != channel("g/window1", 1, 0)


def test_span_errors_name_op_argument_expected_received_and_rank() -> None:
    check_span("put", 4, 4, 8, peer=2, rank=0)
    with pytest.raises(
        InvalidArgumentError,
        match=r"put: argument 'offset' expected .*<= 8 .*rank 2's.*5 \+ numel 4 = 9 \(rank 0\)",
    ):
        check_span("put", 5, 4, 8, peer=2, rank=0)
    with pytest.raises(
        InvalidArgumentError,
        match=r"get: argument 'offset' expected a non-negative .* received -1 \(rank 3\)",
    ):
        check_span("get", -1, 1, 8, peer=0, rank=3)
    with pytest.raises(InvalidTypeError, match=r"argument 'offset' expected an int .*received float"):
        check_span("get", 1.0, 1, 8, peer=0, rank=3)


def test_peer_and_tensor_errors() -> None:
    assert check_peer("signal", "dst", 3, {1: 0, 3: 1}, rank=1) == 1
    with pytest.raises(
        InvalidArgumentError,
        match=r"signal: argument 'dst' expected a rank of the window's group \[1, 3\], received 2 \(rank 1\)",
    ):
        check_peer("signal", "dst", 2, {1: 0, 3: 1}, rank=1)
    with pytest.raises(InvalidTypeError, match="received bool"):
        check_peer("map", "peer", True, {0: 0}, rank=0)
    cpu = torch.device("cpu")
    check_tensor("put", "tensor", torch.zeros(2), torch.float32, cpu, 0)
    with pytest.raises(
        InvalidTypeError,
        match=r"put: argument 'tensor' expected a tensor of the window's dtype torch.float32, received torch.int64 \(rank 4\)",
    ):
        check_tensor("put", "tensor", torch.zeros(2, dtype=torch.int64), torch.float32, cpu, 4)
    with pytest.raises(InvalidArgumentError, match="one dtype on every rank.*rank 1: torch.int32"):
        check_dtypes_agree([torch.float32, torch.int32], [0, 1], 0)


# --- wiring ------------------------------------------------------------------------------------


def test_window_is_exported_lazily_and_native_backends_override_the_default() -> None:
    assert commlayer.window is commlayer.windows.window
    assert Backend.window.__doc__ and "send" in Backend.window.__doc__
    assert get_backend_class("shm").window is not Backend.window
    assert get_backend_class("mpi").window is not Backend.window
    assert get_backend_class("gloo").window is Backend.window  # the two-sided emulation
    assert get_backend_class("ccl").window is not Backend.window  # the emulation on its own channel


def test_a_ccl_windows_payloads_travel_on_a_communicator_named_after_the_window() -> None:
    group = GroupSpec("group2", (1, 3), 3, store=None)
    window = WindowSpec("group2/window4", 4, 1, (8, 8), 30.0, 3, (1, 3))
    channel = payload_spec(group, window)
    assert (channel.ranks, channel.global_rank, channel.group_rank) == ((1, 3), 3, 1)
    assert channel.name == "group2/window4/payloads" != group.name
    assert issubclass(TwoSidedWindow, commlayer.contract.windows.BackendWindow)


# --- real worlds -------------------------------------------------------------------------------


# One world of 4 per backend runs the kit's window checks on windows of 4, 3 and 2 ranks and the
# stress run on 4 and 2 (tests/backends/windows_ranks.py).


@pytest.mark.multirank
@pytest.mark.parametrize("backend", ["shm", "gloo"])
def test_windows_conform_and_stress_exactly(backend: str) -> None:
    run_world("tests.backends.windows_ranks:all_checks", 4, backend=backend, timeout=300)


@pytest.mark.multirank
@pytest.mark.mpi
@pytest.mark.parametrize("pair", ["default", "openmpi"])
def test_windows_on_mpi_rma(pair: str) -> None:
    env = {"COMMLAYER_MPI": "openmpi"} if pair == "openmpi" else {}
    reason = mpirun_unavailable_reason({**os.environ, **env})
    if reason is not None:
        pytest.skip(f"{pair} mpirun unavailable: {reason}")
    run_world(
        "tests.backends.windows_ranks:all_checks", 4, backend="mpi", launcher="mpirun", timeout=300, env=env
    )


@pytest.mark.multirank
@pytest.mark.ccl
def test_windows_on_ccl_two_sided() -> None:
    info = next((info for info in list_backends() if info.name == "ccl"), None)
    if info is None or not info.availability:
        pytest.skip("ccl unavailable")
    run_world("tests.backends.windows_ranks:all_checks", 4, backend="ccl", timeout=300)
