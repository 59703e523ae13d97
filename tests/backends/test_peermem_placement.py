"""Pure logic: where peermem's zero-copy calls tell their peers their tensors are.

The kernel library is stood in for by a double (named as one: it answers the driver's pointer
lookups from a table of segments and records the imports it is asked for); the board and the peers'
registries are real, over one board file in a temporary folder, as a group's processes map it.
Tensors are CPU tensors: only their addresses matter here. What the kernels then do with the
places is checked on the GPU machine (``benchmarks/gpu/peermem.py``).
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import pytest
import torch

from commlayer.backends.peermem import board as boards
from commlayer.backends.peermem.placement import UNPLACED, Placement
from commlayer.backends.peermem.registry import Registry, Segment
from commlayer.core.types import GroupSpec

WORLD = 3


class LibraryDouble:
    """Stands for the kernel library: segments by address, and the imports it is asked for."""

    handle_bytes = 64
    max_descs = 2

    def __init__(self, segments: list[Segment]) -> None:
        self.segments = segments
        self.lookups = 0
        self.imports: list[tuple[int, int]] = []
        self.failing_peers: set[int] = set()
        self.lib = self  # the ctypes entry points and the module's, on one object

    def segment(self, pointer: int) -> tuple[int, int, int, bool] | int:
        self.lookups += 1
        for found in self.segments:
            if found.base <= pointer < found.base + found.size:
                return tuple(found)
        return 1  # the driver's error code: not device memory it knows

    def pm_export(self, base: int, handle: ctypes.Array) -> int:
        handle.raw = base.to_bytes(8, "little") * 8
        return 0

    def pm_import(self, comm: int, peer: int, slot: int, handle: bytes) -> int:
        self.imports.append((peer, slot))
        return 201 if peer in self.failing_peers else 0

    def error_string(self, rc: int) -> str:
        return f"error {rc}"


def _segment_of(tensor: torch.Tensor, buffer_id: int) -> Segment:
    """A segment starting 256 bytes before ``tensor`` and ending with it (tensors of 1 KiB or
    more: no other tensor starts inside it)."""
    return Segment(buffer_id, tensor.data_ptr() - 256, tensor.nbytes + 256, True)


class Group:
    """Rank 0's Placement and its peers' registries over one board."""

    def __init__(self, tmp_path: Path, tensors: list[torch.Tensor]) -> None:
        first = boards.create("placement", tmp_path)
        mappings = [first] + [boards.open_board(first.path) for _ in range(WORLD - 1)]
        self.peers = [Registry(mappings[rank], rank, WORLD) for rank in range(1, WORLD)]
        self.lib = LibraryDouble([_segment_of(t, 10 + n) for n, t in enumerate(tensors)])
        self.capturing = False
        spec = GroupSpec(name="placement", ranks=tuple(range(WORLD)), global_rank=0, store=None)
        registry = Registry(mappings[0], 0, WORLD)
        self.board = mappings[0]
        self.placement = Placement(self.lib, 1, spec, 0, registry, lambda: self.capturing, self._failed)  # type: ignore[arg-type]

    def _failed(self, rc: int) -> None:
        raise RuntimeError(f"peermem: error {rc}")

    def peers_map_everything(self) -> None:
        for registry in self.peers:
            for peer, slot, _ in registry.news():
                registry.mapped(peer, slot, True)


def test_a_tensor_is_staged_until_every_peer_maps_its_segment(tmp_path: Path) -> None:
    tensor = torch.zeros(1024)
    group = Group(tmp_path, [tensor])
    assert group.placement.places("all_reduce", tensor, tensor) == UNPLACED
    assert group.board.posted(0) == 1  # shared for the peers to map
    assert group.placement.places("all_reduce", tensor, tensor) == UNPLACED  # not mapped yet
    group.peers_map_everything()
    assert group.placement.places("all_reduce", tensor[16:], tensor[16:]) == (0, 0, 256 + 64, 256 + 64, -1)
    assert group.board.posted(0) == 1


def test_an_in_place_all_reduce_looks_its_one_tensor_up_once(tmp_path: Path) -> None:
    tensor = torch.zeros(1024)
    group = Group(tmp_path, [tensor])
    group.placement.places("all_reduce", tensor, tensor)
    assert group.lib.lookups == 1
    other = torch.zeros(1024)
    group.lib.segments.append(_segment_of(other, 99))
    group.placement.places("all_reduce", tensor, other)  # out of place: both looked up
    assert group.lib.lookups == 3


def test_each_op_places_only_the_tensors_its_peers_reach(tmp_path: Path) -> None:
    chunk, whole = torch.zeros(256), torch.zeros(1024)
    group = Group(tmp_path, [chunk, whole])
    for op in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        group.placement.places(op, chunk if op == "all_gather_into_tensor" else whole, whole)
    group.peers_map_everything()
    gathered = group.placement.places("all_gather_into_tensor", chunk, whole)  # peers write the output
    scattered = group.placement.places("reduce_scatter_tensor", whole, chunk)  # peers read the input
    assert gathered == (-1, 0, 0, 256, -1) and scattered == (0, -1, 256, 0, -1)
    assert group.board.posted(0) == 1  # the one segment peers reach: whole's


def test_memory_the_driver_does_not_know_stays_staged(tmp_path: Path) -> None:
    group = Group(tmp_path, [])
    tensor = torch.zeros(256)
    assert group.placement.places("all_reduce", tensor, tensor) == UNPLACED
    assert group.board.posted(0) == 0


def test_each_call_first_maps_what_peers_posted_and_a_failed_mapping_stops_that_peer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tensor = torch.zeros(256)
    group = Group(tmp_path, [tensor])
    for registry in group.peers:
        for slot in range(2):
            registry.share(
                Segment(100 * registry.rank + slot, 0x1000 * (slot + 1), 4096, True), lambda b: bytes(64)
            )
    group.lib.failing_peers = {2}
    with caplog.at_level(logging.WARNING, logger="commlayer.backends.peermem.placement"):
        group.placement.places("all_reduce", tensor, tensor)
        group.placement.places("all_reduce", tensor, tensor)
    assert group.lib.imports == [(1, 0), (1, 1), (2, 0)]  # peer 2's later segment left alone
    assert group.board.acked(0, 1) == 2 and group.board.acked(0, 2) == 0
    assert caplog.text.count("failed") == 1 and "mapping rank 2's segment 0 failed: error 201" in caplog.text


def test_a_captured_call_names_mapped_segments_and_gives_the_others_a_descriptor(tmp_path: Path) -> None:
    mapped, unmapped = torch.zeros(256), torch.zeros(256)
    group = Group(tmp_path, [mapped, unmapped])
    group.placement.places("all_reduce", mapped, mapped)
    group.peers_map_everything()
    group.capturing = True
    assert group.placement.places("all_reduce", mapped, mapped) == (0, 0, 256, 256, -1)
    assert group.placement.places("all_reduce", unmapped, unmapped) == (-1, -1, 0, 0, 0)
    assert group.placement.places("all_reduce", unmapped, unmapped) == (-1, -1, 0, 0, 1)
    assert group.placement.places("all_reduce", unmapped, unmapped) == UNPLACED  # descriptors used up
    assert group.board.posted(0) == 1  # a capture shares nothing: register_graph_buffers does
