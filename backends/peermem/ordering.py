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

    order = StreamOrder(raw_stream, current_stream, capturing, torch.cuda.Event)
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
    """Orders one group's kernel launches across the streams they are issued on.

    ``raw_stream()`` is the current stream's handle (cheap), ``current_stream()`` its stream object,
    ``capturing()`` whether the current stream is being captured, ``new_event()`` an event with
    ``record(stream)``, waited on through ``stream.wait_event(event)``.
    """

    __slots__ = (
        "_capturing",
        "_current_stream",
        "_last_stream",
        "_new_event",
        "_raw_stream",
        "joins",
        "last",
    )

    def __init__(
        self,
        raw_stream: Callable[[], int],
        current_stream: Callable[[], Any],
        capturing: Callable[[], bool],
        new_event: Callable[[], Any],
    ) -> None:
        self._raw_stream = raw_stream
        self._current_stream = current_stream
        self._capturing = capturing
        self._new_event = new_event
        #: The handle of the stream the group's last kernel went to (the C fast path launches
        #: there without entering this class, and calls ``stream()`` from any other).
        self.last: int | None = None
        self._last_stream: Any = None
        #: How many launches waited for another stream (the benchmarks report it).
        self.joins = 0

    def stream(self) -> int:
        """The current stream's handle, once it waits for the group's previous kernel."""
        handle = self._raw_stream()
        if handle != self.last:
            if self._capturing():
                self.last, self._last_stream = None, None
            else:
                self._switch(handle, self._current_stream())
        return handle

    def enter(self, stream: Any, handle: int) -> int:
        """``handle`` (``stream``'s, a stream the group owns and never captures), once ``stream``
        waits for the group's previous kernel."""
        if handle != self.last:
            self._switch(handle, stream)
        return handle

    def _switch(self, handle: int, stream: Any) -> None:
        if self._last_stream is not None:
            event = self._new_event()
            event.record(self._last_stream)
            stream.wait_event(event)
            self.joins += 1
        self.last, self._last_stream = handle, stream


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
