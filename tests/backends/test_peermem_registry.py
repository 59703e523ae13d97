"""peermem's registered segments: the board in shared memory and each rank's registry over it.

The ranks here are Registry objects over their own mappings of one real board file, as the
processes of a group map it; the segments are the values the driver would report.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from commlayer.backends.peermem import board as boards
from commlayer.backends.peermem.registry import NOT_PLACED, Registry, Segment

SEGMENT = Segment(buffer_id=7, base=0x7000_0000, size=2 << 20, shareable=True)


def _handle(base: int) -> bytes:
    return base.to_bytes(8, "little") * 8


def _world(tmp_path: Path, world: int) -> list[Registry]:
    first = boards.create("test", tmp_path)
    mappings = [first] + [boards.open_board(first.path) for _ in range(world - 1)]
    return [Registry(mapping, rank, world) for rank, mapping in enumerate(mappings)]


def _map_all(registries: list[Registry]) -> list[tuple[int, int, bytes]]:
    """Every rank maps what its peers posted (as each call does first); returns what was mapped."""
    seen = []
    for registry in registries:
        for peer, slot, handle in registry.news():
            seen.append((peer, slot, handle))
            registry.mapped(peer, slot, True)
    return seen


def test_a_segment_is_staged_until_every_peer_maps_it(tmp_path: Path) -> None:
    registries = _world(tmp_path, 3)
    owner = registries[1]
    pointer = SEGMENT.base + 4096
    assert owner.place(SEGMENT, pointer) == NOT_PLACED
    assert owner.share(SEGMENT, _handle) == 0
    assert owner.place(SEGMENT, pointer) == NOT_PLACED  # posted, nobody has it mapped yet
    registries[0].mapped(1, 0, True)
    assert owner.place(SEGMENT, pointer) == NOT_PLACED  # rank 2 has not
    assert _map_all(registries) == [(1, 0, _handle(SEGMENT.base))]
    assert owner.place(SEGMENT, pointer) == (0, 4096)
    assert owner.share(SEGMENT, _handle) is None  # shared once
    assert _map_all(registries) == []


def test_slots_follow_the_order_of_first_use_per_rank(tmp_path: Path) -> None:
    registries = _world(tmp_path, 2)
    others = [Segment(10 + n, 0x1000_0000 * (n + 1), 1 << 20, True) for n in range(3)]
    assert [registries[0].share(segment, _handle) for segment in others] == [0, 1, 2]
    assert registries[1].share(others[0], _handle) == 0  # each rank numbers its own
    mapped = _map_all(registries)
    assert [(peer, slot) for peer, slot, _ in mapped] == [(1, 0), (0, 0), (0, 1), (0, 2)]
    assert registries[0].place(others[2], others[2].base + 16) == (2, 16)


def test_a_segment_allocated_again_is_a_new_segment(tmp_path: Path) -> None:
    registries = _world(tmp_path, 2)
    registries[0].share(SEGMENT, _handle)
    _map_all(registries)
    again = Segment(buffer_id=8, base=SEGMENT.base, size=SEGMENT.size, shareable=True)
    assert registries[0].place(again, again.base) == NOT_PLACED  # same address, new buffer id
    assert registries[0].share(again, _handle) == 1


def test_segments_that_cannot_be_shared_stay_staged(tmp_path: Path) -> None:
    registries = _world(tmp_path, 2)
    vmm = Segment(buffer_id=9, base=0x9000_0000, size=1 << 21, shareable=False)
    assert registries[0].share(vmm, _handle) is None
    assert registries[0].share(SEGMENT, lambda base: None) is None  # the export failed
    assert registries[0].share(None, _handle) is None
    assert registries[0].place(None, 0) == NOT_PLACED
    assert registries[0].board.posted(0) == 0


def test_slots_run_out_and_later_segments_stay_staged(tmp_path: Path) -> None:
    first = boards.create("test", tmp_path)
    registry = Registry(first, 0, 2, max_slots=2)
    segments = [Segment(n, 0x1000 * (n + 1) << 20, 1 << 20, True) for n in range(3)]
    assert [registry.share(segment, _handle) for segment in segments] == [0, 1, None]


def test_a_peer_whose_segment_fails_to_map_keeps_staging(tmp_path: Path) -> None:
    registries = _world(tmp_path, 2)
    owner, mapper = registries
    first, second = SEGMENT, Segment(8, 0x8000_0000, 1 << 20, True)
    owner.share(first, _handle)
    owner.share(second, _handle)
    news = list(mapper.news())
    mapper.mapped(0, news[0][1], False)
    mapper.mapped(0, news[1][1], True)  # ignored: slots are acknowledged in order
    assert list(mapper.news()) == []  # no more tries for that peer
    assert owner.place(first, first.base) == owner.place(second, second.base) == NOT_PLACED


def test_the_board_refuses_out_of_order_posts(tmp_path: Path) -> None:
    board = boards.create("test", tmp_path)
    with pytest.raises(ValueError, match="posted slot 1 \\(expected 0"):
        board.post(0, 1, _handle(1))
    with pytest.raises(ValueError, match="handle of 3 bytes"):
        board.post(0, 0, b"abc")
    board.unlink()
    assert not board.path.exists()


def _post_from_another_process(path: str) -> None:
    board = boards.open_board(path)
    board.post(1, 0, _handle(0xABC))


def test_the_board_is_shared_between_processes(tmp_path: Path) -> None:
    board = boards.create("test", tmp_path)
    process = multiprocessing.get_context("spawn").Process(
        target=_post_from_another_process, args=(str(board.path),)
    )
    process.start()
    process.join(60)
    assert process.exitcode == 0
    registry = Registry(board, 0, 2)
    assert list(registry.news()) == [(1, 0, _handle(0xABC))]
