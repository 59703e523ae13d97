"""The window every backend gets by default: one-sided ops emulated with two-sided messages.

Each op is a header (:mod:`.window_messages`) pushed onto a store queue per (origin, target) pair; a
put's data and a get's answer travel over the backend's ``send``/``recv`` on the window's tags,
each send issued before the header announcing it, so a rank only ever receives data that is
already on its way. A rank *applies* what its queues hold whenever it makes a window call (any:
``put``, ``get``, ``signal``, ``wait_signal``, ``fence``): puts land in its window, signals are
counted, gets are answered. Polling the queues (never a backend receive) keeps every wait bounded
on any backend, gloo included, whose receives can be neither tested nor timed out safely.

So here a put completes remotely at the target's next window call: it is guaranteed visible after
the target's matching ``wait_signal`` (the signal follows the put in the same queue) or after a
``fence``; a get completes once the target makes a window call. Puts copy their source before
sending, so their Work completes at once; the copies are held until their send completes (on
gloo, whose sends report completion only when waited for, until the next fence).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import torch

from commlayer.contract.window_messages import Header, Kind, channel, decode, encode, tag
from commlayer.contract.windows import BackendWindow, PollWork, WindowSpec, group_timeout, signal_timeout
from commlayer.core.work import CompletedWork, Work

__all__ = ["HeaderStore", "PointToPoint", "TwoSidedWindow"]


class PointToPoint(Protocol):
    """The two core ops of :class:`~commlayer.contract.backend.Backend` the emulation needs."""

    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool) -> Work: ...

    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool) -> Work: ...


class HeaderStore(Protocol):
    """The queue calls of ``torch.distributed.Store`` the emulation needs."""

    def queue_push(self, key: str, value: bytes) -> None: ...

    def queue_pop(self, key: str, block: bool = True) -> bytes: ...

    def queue_len(self, key: str) -> int: ...


class _PendingGet:
    def __init__(self, out: torch.Tensor) -> None:
        self.out = out
        self.done = False


class TwoSidedWindow(BackendWindow):
    """A window over ``transport``'s send/recv and ``store``'s queues; see the module docstring."""

    def __init__(
        self, transport: PointToPoint, store: HeaderStore, tensor: torch.Tensor, spec: WindowSpec
    ) -> None:
        super().__init__(tensor, spec)
        self._transport, self._store = transport, store
        self._flat = tensor.view(-1)
        me = spec.rank
        self._peers = [peer for peer in range(spec.size) if peer != me]
        self._inbox = {peer: channel(spec.key, peer, me) for peer in self._peers}
        self._outbox = {peer: channel(spec.key, me, peer) for peer in self._peers}
        self._signals = [0] * spec.size  # signals received from each rank
        self._consumed = [0] * spec.size  # of which wait_signal took
        self._fences = [0] * spec.size  # FENCE headers received from each rank
        self._drained = [0] * spec.size  # DRAINED headers received from each rank
        self._fenced = 0  # fences this rank entered
        self._gets: dict[int, deque[_PendingGet]] = {peer: deque() for peer in self._peers}
        self._sending: list[tuple[Work, torch.Tensor]] = []  # sends and their buffers, until done
        self._payloads_to = [0] * spec.size  # payload messages sent to each rank, numbering their tags

    # --- the ops ---------------------------------------------------------------------------

    def put(self, src: torch.Tensor, dst: int, offset: int, *, async_op: bool) -> Work:
        self.progress()
        if dst == self.spec.rank:
            self._flat[offset : offset + src.numel()].copy_(src.view(-1))
        else:
            seq = self._send(src.detach().clone(), dst)
            self._push(dst, Header(Kind.PUT, offset, src.numel(), seq))
        return CompletedWork()

    def get(self, out: torch.Tensor, src: int, offset: int, *, async_op: bool) -> Work:
        self.progress()
        if src == self.spec.rank:
            out.view(-1).copy_(self._flat[offset : offset + out.numel()])
            return CompletedWork()
        pending = _PendingGet(out)
        self._gets[src].append(pending)
        self._push(src, Header(Kind.GET, offset, out.numel()))
        work = self._poll(lambda: pending.done, "get", src)
        return work if async_op else _waited(work)

    def signal(self, dst: int, *, async_op: bool) -> Work:
        self.progress()
        if dst == self.spec.rank:
            self._signals[dst] += 1
        else:
            self._push(dst, Header(Kind.SIGNAL))
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
        """Two rounds: FENCE says "all I sent is queued", DRAINED "all you sent me is applied"."""
        self.progress()
        self._fenced += 1
        fenced, peers = self._fenced, self._peers
        for peer in peers:
            self._push(peer, Header(Kind.FENCE))
        stage = [Kind.FENCE]

        def everyone_done() -> bool:
            self.progress()
            if stage[0] is Kind.FENCE and all(self._fences[peer] >= fenced for peer in peers):
                stage[0] = Kind.DRAINED
                for peer in peers:
                    self._push(peer, Header(Kind.DRAINED))
            return stage[0] is Kind.DRAINED and all(self._drained[peer] >= fenced for peer in peers)

        def finished() -> Work:
            # Every peer applied what this rank sent, so its sends are complete: release them.
            for work, _ in self._sending:
                work.wait()
            self._sending.clear()
            return CompletedWork()

        work = PollWork(everyone_done, self.spec.timeout_s, lambda: group_timeout("fence", self.spec))
        if async_op:
            return work.then(finished)
        work.wait()
        return finished()

    def close(self) -> None:
        self._sending.clear()

    # --- applying what peers sent ----------------------------------------------------------

    def progress(self) -> None:
        """Apply every header that has arrived, in order per peer, and test this rank's sends.

        Testing matters where a send moves only while its sender calls the library (oneCCL);
        sends that report done are released.
        """
        store = self._store
        for peer in self._peers:
            key = self._inbox[peer]
            for _ in range(store.queue_len(key)):
                self._apply(peer, decode(store.queue_pop(key, False)))
        if self._sending:
            self._sending = [entry for entry in self._sending if not entry[0].is_completed()]

    def _apply(self, peer: int, header: Header) -> None:
        part = self._flat[header.offset : header.offset + header.numel]
        if header.kind is Kind.PUT:
            self._receive(part, peer, header.seq)  # sent before its header
        elif header.kind is Kind.SIGNAL:
            self._signals[peer] += 1
        elif header.kind is Kind.GET:
            seq = self._send(part.clone(), peer)
            self._push(peer, Header(Kind.REPLY, seq=seq))
        elif header.kind is Kind.REPLY:
            pending = self._gets[peer].popleft()
            self._receive(pending.out, peer, header.seq)
            pending.done = True
        elif header.kind is Kind.FENCE:
            self._fences[peer] += 1
        else:
            self._drained[peer] += 1

    def _push(self, dst: int, header: Header) -> None:
        self._store.queue_push(self._outbox[dst], encode(header))

    def _send(self, payload: torch.Tensor, dst: int) -> int:
        """Send ``payload`` to ``dst`` on the next tag of that pair; returns the message's number."""
        seq = self._payloads_to[dst]
        self._payloads_to[dst] += 1
        work = self._transport.send(payload, dst, tag(self.spec.index, seq), async_op=True)
        self._sending.append((work, payload))
        return seq

    def _receive(self, into: torch.Tensor, src: int, seq: int) -> None:
        self._transport.recv(into, src, tag(self.spec.index, seq), async_op=True).wait()

    def _poll(self, done: object, op: str, peer: int) -> PollWork:
        def test() -> bool:
            self.progress()
            return bool(done())  # type: ignore[operator]

        return PollWork(test, self.spec.timeout_s, lambda: group_timeout(op, self.spec, peer))


def _waited(work: Work) -> Work:
    work.wait()
    return CompletedWork()
