"""Where a zero-copy call's tensors are for its peers: a registered segment and an offset, or staged.

An eager call looks its tensors' segments up in the driver (the pointer's allocation and buffer id)
and names them by the slots every peer has mapped (:mod:`.registry`); a segment met for the first
time is posted for the peers to map, and staged until they have. Each call first maps what the
peers posted since (and acknowledges it), so no rank ever waits for another here. A call captured
in a CUDA graph names segments every peer maps at capture; the others get a descriptor the kernel
reads at replay, which :meth:`Placement.register_graph_buffers` fills in once every peer maps them.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from datetime import timedelta

import torch

from commlayer.backends.peermem.kernel_library import KernelLibrary
from commlayer.backends.peermem.registry import NOT_PLACED, Registry, Segment
from commlayer.core.types import GroupSpec

__all__ = ["PLACED", "UNPLACED", "Placement"]

_log = logging.getLogger(__name__)

#: Which of a call's tensors peers reach in place, per op: (input, output).
PLACED = {
    "all_reduce": (True, True),
    "all_gather_into_tensor": (False, True),
    "reduce_scatter_tensor": (True, False),
    "all_to_all_single": (True, False),
}
#: ``(in_slot, out_slot, in_off, out_off, descriptor)`` of a call staged on both sides.
UNPLACED = (-1, -1, 0, 0, -1)
Places = tuple[int, int, int, int, int]


class Placement:
    """The places of one group's zero-copy calls on this rank.

    ``failed(rc)`` raises the error of the kernel library's return code ``rc``.
    """

    def __init__(
        self,
        lib: KernelLibrary,
        handle: int,
        spec: GroupSpec,
        device: int,
        registry: Registry,
        capturing: Callable[[], bool],
        failed: Callable[[int], None],
    ) -> None:
        self._lib, self._handle, self._spec, self._device = lib, handle, spec, device
        self._registry, self._capturing, self._failed = registry, capturing, failed
        self._captured: list[tuple[int, int, int]] = []  # (descriptor, input pointer, output pointer)
        self._registrations = 0
        self._descriptors = 0

    def places(self, op: str, source: torch.Tensor, output: torch.Tensor) -> Places:
        """``(in_slot, out_slot, in_off, out_off, descriptor)`` of a zero-copy call's tensors."""
        wants_in, wants_out = PLACED[op]
        if self._capturing():
            return self._captured_places(
                source.data_ptr() if wants_in else 0, output.data_ptr() if wants_out else 0
            )
        self._map_news()
        source_pointer, output_pointer = source.data_ptr(), output.data_ptr()
        in_slot, in_off = self._place(source_pointer) if wants_in else NOT_PLACED
        if wants_in and wants_out and output_pointer == source_pointer:  # in-place all_reduce: one lookup
            return in_slot, in_slot, in_off, in_off, -1
        out_slot, out_off = self._place(output_pointer) if wants_out else NOT_PLACED
        return in_slot, out_slot, in_off, out_off, -1

    def _place(self, pointer: int, share: bool = True) -> tuple[int, int]:
        segment = self._segment(pointer)
        place = self._registry.place(segment, pointer)
        if place == NOT_PLACED and share:
            self._registry.share(segment, self._export)
        return place

    def _segment(self, pointer: int) -> Segment | None:
        """The allocation holding ``pointer`` (None when the driver cannot say)."""
        found = self._lib.segment(pointer)
        return None if isinstance(found, int) else Segment._make(found)

    def _export(self, base: int) -> bytes | None:
        handle = ctypes.create_string_buffer(self._lib.handle_bytes)
        return None if self._lib.lib.pm_export(base, handle) else handle.raw

    def _map_news(self) -> None:
        """Map the segments peers posted since the last call, and acknowledge them."""
        for peer, slot, handle in self._registry.news():
            rc = self._lib.lib.pm_import(self._handle, peer, slot, handle)
            if rc:
                _log.warning(
                    "peermem: mapping rank %d's segment %d failed: %s", peer, slot, self._lib.error_string(rc)
                )
            self._registry.mapped(peer, slot, rc == 0)

    def _captured_places(self, source: int, output: int) -> Places:
        # Segments every peer maps already are named at capture; others are read at replay from
        # a descriptor, which register_graph_buffers fills in once every peer maps them.
        place = self._captured_place(source, output)
        if place is not None:
            return (*place, -1)
        if self._descriptors >= self._lib.max_descs:
            return UNPLACED
        descriptor = self._descriptors
        self._descriptors += 1
        self._captured.append((descriptor, source, output))
        return -1, -1, 0, 0, descriptor

    def register_graph_buffers(self, timeout: timedelta | None = None) -> int:
        """Let the kernels of captured graphs read and write their tensors in place.

        Collective: every member calls it after capturing the same graphs, between replays. Shares
        the segments of the calls captured since the last registration, waits until every peer
        maps them, and fills in the calls' descriptors; their replays from then on skip the
        staging copies. A call whose tensor lies in a segment that cannot be shared stays staged.
        Returns how many calls' tensors are now reached in place.
        """
        torch.cuda.synchronize(self._device)
        captured, self._captured = self._captured, []
        pending = [
            entry for entry in captured if all(self._shared(pointer) for pointer in entry[1:] if pointer)
        ]
        limit = timeout or self._spec.timeout
        self._registrations += 1
        prefix = f"commlayer/peermem/{self._spec.name}/graphs/{self._registrations}"
        self._spec.store.set(f"{prefix}/{self._spec.group_rank}", b"1")
        self._spec.store.wait([f"{prefix}/{rank}" for rank in range(self._spec.size)], limit)
        deadline = time.monotonic() + limit.total_seconds()
        done = 0
        while True:
            self._map_news()  # peers wait for this rank to map theirs, as this rank waits for them
            waiting = []
            for descriptor, source, output in pending:
                place = self._captured_place(source, output)
                if place is None:
                    waiting.append((descriptor, source, output))
                    continue
                rc = self._lib.lib.pm_set_place(self._handle, descriptor, *place)
                if rc:
                    self._failed(rc)
                done += 1
            pending = waiting
            if not pending or time.monotonic() > deadline:
                return done
            time.sleep(0.0005)

    def _shared(self, pointer: int) -> bool:
        """Share ``pointer``'s segment unless it is; whether it now has a slot."""
        segment = self._segment(pointer)
        if segment is None:
            return False
        self._registry.share(segment, self._export)
        return self._registry.slot_of(segment) is not None

    def _captured_place(self, source: int, output: int) -> tuple[int, int, int, int] | None:
        """``(in_slot, out_slot, in_off, out_off)`` once every peer maps the call's tensors."""
        in_slot, in_off = self._place(source, False) if source else NOT_PLACED
        out_slot, out_off = self._place(output, False) if output else NOT_PLACED
        if (source and in_slot < 0) or (output and out_slot < 0):
            return None
        return in_slot, out_slot, in_off, out_off
