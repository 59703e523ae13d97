"""peermem's kernels keep one order per group across streams (FSDP2 all-gathers and reduce-scatters
on two side streams): the launch ordering, on the CPU, with streams and events that record what a
GPU would be told."""

from __future__ import annotations

from commlayer.backends.peermem.ordering import StreamOrder


class Streams:
    """A current stream that tests switch, and a log of the record/wait calls the GPU would get."""

    def __init__(self) -> None:
        self.current = "default"
        self.capturing = False
        self.log: list[tuple[str, str]] = []

    def raw(self) -> int:
        return hash(self.current)

    def stream(self) -> Stream:
        return Stream(self.current, self.log)

    def event(self) -> Event:
        return Event(self.log)


class Event:
    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.log = log
        self.on = ""

    def record(self, stream: Stream) -> None:
        self.on = stream.name
        self.log.append(("record", stream.name))


class Stream:
    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log

    def wait_event(self, event: Event) -> None:
        self.log.append((f"{self.name} waits", event.on))


def order_of(streams: Streams) -> StreamOrder:
    return StreamOrder(streams.raw, streams.stream, lambda: streams.capturing, streams.event)


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
        ("record", "all_gather"),
        ("reduce_scatter waits", "all_gather"),
        ("record", "reduce_scatter"),
        ("all_gather waits", "reduce_scatter"),
        ("record", "all_gather"),
        ("reduce_scatter waits", "all_gather"),
        ("record", "reduce_scatter"),
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
    assert streams.log == [("record", "default"), ("side waits", "default")]
