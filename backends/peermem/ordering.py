"""One order on the GPU for a group's kernels, whatever streams its calls are launched on.

The kernels of a group share its epoch, its barrier counts and its two staging halves (see
``csrc/peermem/common.cuh``): each must start after the group's previous kernel has finished on
this GPU, and every rank must run them in the same order, the order their calls were issued.
Launched on one stream they are (DDP, tensor parallelism, CUDA graphs). FSDP2 all-gathers on one
side stream and reduce-scatters on another; kernels of those streams would run at once, or in
an order that differs between ranks, and the group would hang until its timeout. So a launch on
another stream than the group's previous launch first makes its stream wait for the previous
stream's work enqueued so far (which holds the previous kernel), as NCCL orders a communicator's
calls on one internal stream::

    order = StreamOrder(raw_stream, capturing, join)
    launch(..., order.stream())      # the current stream, after the group's previous kernel

Large asynchronous calls go to a stream the group owns (``enter``), after the caller's work so far,
so that the compute the caller queues next runs beside them. Launches on one stream pay one
comparison of raw stream handles. During graph capture no wait is added (the captured stream may
not wait on work outside the capture; torch synchronizes before a capture begins) and the next
launch outside the capture starts a new order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["EventRing", "StreamOrder", "on_group_stream"]


def on_group_stream(
    async_op: bool, nbytes: int, threshold: int, from_default_stream: Callable[[], bool]
) -> bool:
    """Whether a call runs on the group's own stream: asynchronous, at least ``threshold`` bytes
    (``COMMLAYER_PEERMEM_ASYNC_BYTES``; a negative threshold keeps every call on the caller's
    stream), and issued from the device's default stream, where the caller's compute runs. A
    caller that issues from a stream of its own (DeepSpeed's ZeRO-3, FSDP2) has arranged the
    overlap already, and one more stream would only add joins. The stream is asked last, so
    synchronous and small calls never pay for it. Calls captured in a graph never run there."""
    return async_op and 0 <= threshold <= nbytes and from_default_stream()


class StreamOrder:
    """Orders one group's kernel launches across the streams they are issued on, by their raw
    handles.

    ``raw_stream()`` is the current stream's handle (cheap), ``capturing()`` whether the current
    stream is being captured, and ``join(waiting, after)`` makes stream ``waiting`` wait for the
    work enqueued on stream ``after`` so far.
    """

    __slots__ = ("_capturing", "_join", "_raw_stream", "joins", "last")

    def __init__(
        self,
        raw_stream: Callable[[], int],
        capturing: Callable[[], bool],
        join: Callable[[int, int], None],
    ) -> None:
        self._raw_stream = raw_stream
        self._capturing = capturing
        self._join = join
        #: The handle of the stream the group's last kernel went to (the C fast path launches
        #: there without entering this class, and calls ``stream()`` from any other).
        self.last: int | None = None
        #: How many launches waited for another stream (the benchmarks report it).
        self.joins = 0

    def stream(self) -> int:
        """The current stream's handle, once it waits for the group's previous kernel."""
        handle = self._raw_stream()
        if handle != self.last:
            if self._capturing():
                self.last = None
            else:
                self._switch(handle)
        return handle

    def enter(self, handle: int) -> int:
        """``handle`` (a stream the group owns and never captures), once that stream waits for
        the group's previous kernel."""
        if handle != self.last:
            self._switch(handle)
        return handle

    def _switch(self, handle: int) -> None:
        if self.last is not None:
            self._join(handle, self.last)
            self.joins += 1
        self.last = handle


class EventRing:
    """The events that mark where the group's calls on its own stream end, handed out in turn.

    One event per call would cost each call an event's creation and destruction. An event handed
    out again after ``size`` later calls is recorded again, later on the same stream: a Work
    waited for that late waits for a later kernel of the group, which the stream runs after its
    own (a wait that may come late, never early). ``new_event()`` returns an event already created
    on that stream (its handle readable).
    """

    __slots__ = ("_events", "_next")

    def __init__(self, size: int, new_event: Callable[[], Any]) -> None:
        self._events = [new_event() for _ in range(size)]
        self._next = 0

    def take(self) -> Any:
        event = self._events[self._next]
        self._next = (self._next + 1) % len(self._events)
        return event
