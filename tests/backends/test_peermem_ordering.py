"""peermem's kernels keep one order per group across streams (FSDP2 all-gathers and reduce-scatters
on two side streams): the launch ordering, on the CPU, with streams and events that record what a
GPU would be told."""

from __future__ import annotations

from commlayer.backends.peermem.ordering import EventRing, StreamOrder, on_group_stream


class Streams:
    """A current stream that tests switch, and a log of the joins the GPU would be told of."""

    def __init__(self) -> None:
        self.current = "default"
        self.capturing = False
        self.log: list[tuple[str, str]] = []
        self.names: dict[int, str] = {}

    def raw(self) -> int:
        return self.handle(self.current)

    def handle(self, name: str) -> int:
        self.names[hash(name)] = name
        return hash(name)

    def join(self, waiting: int, after: int) -> None:
        self.log.append((f"{self.names[waiting]} waits", self.names[after]))


def order_of(streams: Streams) -> StreamOrder:
    return StreamOrder(streams.raw, lambda: streams.capturing, streams.join)


def launch_on(order: StreamOrder, streams: Streams, name: str) -> int:
    streams.current = name
    return order.stream()


def test_one_stream_adds_nothing() -> None:
    streams = Streams()
    order = order_of(streams)
    for _ in range(5):
        assert launch_on(order, streams, "default") == hash("default")
    assert streams.log == [] and order.joins == 0


def test_fsdp2_streams_run_the_kernels_in_issue_order() -> None:
    """all-gather on one stream, reduce-scatter on another, the loss on the default one: every
    switch waits for the stream of the group's previous kernel, so no two kernels overlap."""
    streams = Streams()
    order = order_of(streams)
    for name in ["all_gather", "all_gather", "reduce_scatter", "all_gather", "reduce_scatter", "default"]:
        launch_on(order, streams, name)
    assert streams.log == [
        ("reduce_scatter waits", "all_gather"),
        ("all_gather waits", "reduce_scatter"),
        ("reduce_scatter waits", "all_gather"),
        ("default waits", "reduce_scatter"),
    ]
    assert order.joins == 4


def test_graph_capture_adds_no_wait_and_restarts_the_order() -> None:
    streams = Streams()
    order = order_of(streams)
    launch_on(order, streams, "default")
    streams.capturing = True
    launch_on(order, streams, "capture")
    launch_on(order, streams, "capture")
    streams.capturing = False
    launch_on(order, streams, "default")  # after the capture: nothing outside it to wait for
    launch_on(order, streams, "side")
    assert streams.log == [("side waits", "default")]


def test_group_stream_waits_for_the_previous_kernel_and_the_caller_waits_for_it() -> None:
    """Large async calls go to the group's own stream: it joins the caller's stream's kernel, and
    the next call on the caller's stream joins the group's stream; back-to-back group-stream
    launches add nothing."""
    streams = Streams()
    order = order_of(streams)
    group = streams.handle("group")
    launch_on(order, streams, "default")
    assert order.enter(group) == group
    order.enter(group)
    launch_on(order, streams, "default")
    assert streams.log == [("group waits", "default"), ("default waits", "group")]
    assert order.joins == 2


def test_only_large_async_calls_from_the_default_stream_run_on_the_group_stream() -> None:
    default, side = (lambda: True), (lambda: False)
    assert on_group_stream(True, 1 << 20, 1 << 20, default)
    assert not on_group_stream(True, (1 << 20) - 1, 1 << 20, default)
    assert not on_group_stream(False, 1 << 30, 1 << 20, default)
    assert on_group_stream(True, 0, 0, default)
    assert not on_group_stream(True, 1 << 30, -1, default)
    assert not on_group_stream(True, 1 << 30, 1 << 20, side)  # the caller's own side stream


def test_the_stream_is_asked_only_for_large_async_calls() -> None:
    def asked() -> bool:
        raise AssertionError("the current stream was read for a call that cannot move")

    assert not on_group_stream(False, 1 << 30, 1 << 20, asked)
    assert not on_group_stream(True, 1 << 10, 1 << 20, asked)
    assert not on_group_stream(True, 1 << 30, -1, asked)


def test_event_ring_hands_out_each_event_in_turn_then_again() -> None:
    made: list[int] = []

    def new_event() -> int:
        made.append(len(made))
        return made[-1]

    ring = EventRing(3, new_event)
    assert made == [0, 1, 2]  # every event exists before the first call
    assert [ring.take() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
