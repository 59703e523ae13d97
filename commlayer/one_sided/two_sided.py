"""The window every backend gets by default: one-sided ops emulated with the backend's send/recv.

A put, signal, get request or fence marker is a header (:mod:`.messages`) sent to the target on
the window's header tag, a put's payload following on the data tag. Each rank keeps one header
receive posted per peer and *applies* what arrived whenever it makes a window call: puts land in
its window, signals are counted, gets are answered on the reply tag. So a put issued here
completes remotely at the target's next window call at the latest; it is guaranteed visible after
the target's matching ``wait_signal`` (the signal follows the put on the same ordered channel) or
after a ``fence``. A get completes once the target makes a window call (any: ``wait_signal``,
``fence``, ``put``, ...). Puts copy their source before sending, so their Work completes at once.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ..work import CompletedWork, Work
from .contract import BackendWindow, PollWork, WindowSpec, group_timeout, signal_timeout
from .messages import HEADER_NUMEL, Header, Kind, decode, encode, tag

__all__ = ["PointToPoint", "TwoSidedWindow"]

_HEADERS, _DATA, _REPLIES = 0, 1, 2


class PointToPoint(Protocol):
    """The two core ops of :class:`~commlayer.backend.Backend` the emulation needs."""

    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool) -> Work: ...

    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool) -> Work: ...


class TwoSidedWindow(BackendWindow):
    """A window over ``transport``'s send/recv; see the module docstring for when effects land."""

    def __init__(self, transport: PointToPoint, tensor: torch.Tensor, spec: WindowSpec) -> None:
        super().__init__(tensor, spec)
        self._transport = transport
        self._flat = tensor.view(-1)
        self._tags = [tag(spec.index, channel) for channel in range(3)]
        self._peers = [peer for peer in range(spec.size) if peer != spec.rank]
        self._headers: dict[int, tuple[torch.Tensor, Work]] = {}
        self._signals = [0] * spec.size  # signals received from each rank
        self._consumed = [0] * spec.size  # of which wait_signal took
        self._fences = [0] * spec.size  # fence markers received from each rank
        self._fenced = 0  # fences this rank entered
        self._sending: list[tuple[Work, tuple[torch.Tensor, ...]]] = []
        for peer in self._peers:
            self._post_header_receive(peer)

    # --- the ops ---------------------------------------------------------------------------

    def put(self, src: torch.Tensor, dst: int, offset: int, *, async_op: bool) -> Work:
        self.progress()
        if dst == self.spec.rank:
            self._flat[offset : offset + src.numel()].copy_(src.view(-1))
        else:
            self._send(dst, Header(Kind.PUT, offset, src.numel()), src.detach().clone())
        return CompletedWork()

    def get(self, out: torch.Tensor, src: int, offset: int, *, async_op: bool) -> Work:
        self.progress()
        if src == self.spec.rank:
            out.view(-1).copy_(self._flat[offset : offset + out.numel()])
            return CompletedWork()
        self._send(src, Header(Kind.GET, offset, out.numel()))
        reply = self._transport.recv(out, src, self._tags[_REPLIES], async_op=True)
        work = self._served(reply.is_completed, "get", src)
        return work if async_op else _waited(work)

    def signal(self, dst: int, *, async_op: bool) -> Work:
        self.progress()
        if dst == self.spec.rank:
            self._signals[dst] += 1
        else:
            self._send(dst, Header(Kind.SIGNAL))
        return CompletedWork()

    def wait_signal(self, src: int, timeout_s: float, *, async_op: bool) -> Work:
        self._consumed[src] += 1
        wanted = self._consumed[src]

        def arrived() -> bool:
            self.progress()
            return self._signals[src] >= wanted

        def expired() -> Exception:
            self._consumed[src] -= 1  # a wait that timed out consumed no signal
            return signal_timeout(self.spec, src, timeout_s)

        work = PollWork(arrived, timeout_s, expired)
        return work if async_op else _waited(work)

    def fence(self, *, async_op: bool) -> Work:
        self.progress()
        self._fenced += 1
        for peer in self._peers:
            self._send(peer, Header(Kind.FENCE))
        fenced = self._fenced

        def everyone_fenced() -> bool:
            self.progress()
            return all(self._fences[peer] >= fenced for peer in self._peers) and not self._sending

        work = PollWork(everyone_fenced, self.spec.timeout_s, lambda: group_timeout("fence", self.spec))
        return work if async_op else _waited(work)

    def close(self) -> None:
        self._sending.clear()

    # --- applying what peers sent ----------------------------------------------------------

    def progress(self) -> None:
        """Apply every header that has arrived, in order per peer, and retire finished sends."""
        for peer in self._peers:
            buffer, work = self._headers[peer]
            while work.is_completed():
                work.wait()  # raises a failed receive's error
                self._apply(peer, decode(buffer))
                buffer, work = self._post_header_receive(peer)
        self._sending = [entry for entry in self._sending if not entry[0].is_completed()]

    def _apply(self, peer: int, header: Header) -> None:
        part = self._flat[header.offset : header.offset + header.numel]
        if header.kind is Kind.PUT:
            # The payload follows its header on the same channel: it has been sent already.
            self._transport.recv(part, peer, self._tags[_DATA], async_op=True).wait()
        elif header.kind is Kind.SIGNAL:
            self._signals[peer] += 1
        elif header.kind is Kind.GET:
            reply = part.clone()
            self._sending.append(
                (self._transport.send(reply, peer, self._tags[_REPLIES], async_op=True), (reply,))
            )
        else:
            self._fences[peer] += 1

    def _post_header_receive(self, peer: int) -> tuple[torch.Tensor, Work]:
        buffer = torch.empty(HEADER_NUMEL, dtype=torch.int64, device=self.tensor.device)
        entry = self._headers[peer] = (
            buffer,
            self._transport.recv(buffer, peer, self._tags[_HEADERS], async_op=True),
        )
        return entry

    def _send(self, dst: int, header: Header, payload: torch.Tensor | None = None) -> None:
        encoded = encode(header).to(self.tensor.device)
        self._sending.append(
            (self._transport.send(encoded, dst, self._tags[_HEADERS], async_op=True), (encoded,))
        )
        if payload is not None:
            work = self._transport.send(payload, dst, self._tags[_DATA], async_op=True)
            self._sending.append((work, (payload,)))

    def _served(self, done: Any, op: str, peer: int) -> PollWork:
        def test() -> bool:
            self.progress()
            return bool(done())

        return PollWork(test, self.spec.timeout_s, lambda: group_timeout(op, self.spec, peer))


def _waited(work: Work) -> Work:
    work.wait()
    return CompletedWork()
