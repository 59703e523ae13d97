"""The Work of one peermem kernel launch: a wait reports a peer's timeout and orders the waiting
stream after the kernel."""

from __future__ import annotations

import ctypes
from datetime import timedelta
from typing import Protocol

import torch

from commlayer.core.work import Work

__all__ = ["KernelGroup", "PeerWork"]


class KernelGroup(Protocol):
    """What a Work needs of its group: the flag a timed-out kernel raises, the error it names, and
    the ordering of the current stream after an event."""

    failed: ctypes.c_int

    def raise_if_failed(self, name: str) -> None: ...

    def wait_for(self, event: torch.cuda.Event) -> None: ...


class PeerWork(Work):
    """A launched kernel: a wait reports a peer's timeout and makes the current stream wait for the
    kernel (needed after a launch on the group's own stream, or for a wait on another stream).

    A kernel on the group's own stream keeps its tensors (``stash``) until the wait, as torch's NCCL
    does without ``record_stream``: marking them used on that stream would keep the caching
    allocator from reusing their blocks until the stream's later work ends, and callers that free
    and reallocate per call (DeepSpeed's ZeRO-3 gathers) would allocate afresh each time. A Work
    dropped without a wait marks them then, so their memory still outlives the kernel.
    """

    __slots__ = ("_comm", "_event", "_stash")

    def __init__(
        self,
        comm: KernelGroup,
        result: tuple[torch.Tensor, ...],
        event: torch.cuda.Event | None,
        stash: tuple[torch.cuda.Stream, tuple[torch.Tensor, ...]] | None = None,
    ) -> None:
        self._result = result
        self._comm = comm
        self._event = event
        self._stash = stash

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        if self._comm.failed.value:
            self._comm.raise_if_failed("wait")
        if self._event is not None:
            self._comm.wait_for(self._event)
        self._stash = None
        return True

    def stream_event(self) -> torch.cuda.Event | None:
        """The kernel's event, unless a call of the group has timed out (then a wait reports it)."""
        return None if self._comm.failed.value else self._event

    def __del__(self) -> None:
        if self._stash is not None:
            stream, tensors = self._stash
            for tensor in tensors:
                tensor.record_stream(stream)

    def is_completed(self) -> bool:
        return self.wait()

    def _test(self) -> bool:
        return self.wait()

    def _block(self, timeout_s: float | None) -> bool:
        return self.wait()
