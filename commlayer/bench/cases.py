"""One benchmarked op at one size: its buffers, its run, and the exact check of its result.

Every rank can compute every other rank's input, so a result is checked locally. Rank ``r``'s
element ``i`` at iteration ``it`` holds ``1 + r + n * ((i + it) % M)``: distinct per rank, distinct
per element modulo ``M``, different at every iteration, never 0 (the fill of outputs), and ``M`` is
chosen so that even the sum over ``n`` ranks is an exactly representable integer in the dtype.

Buffer layout, world of 2, all_gather of S = 16 bytes of float32 (count 4, chunk 2)::

    rank 0 input [1, 3]   rank 1 input [2, 4]   every output [1, 3, 2, 4]

pingpong pairs ranks (0, 1), (2, 3), ...; an odd last rank sits out. Its time is half a round trip.

Windows (``put``, ``get``): every rank registers a window of S bytes; rank ``r`` puts its values
into rank ``(r + 1) % n``'s window (``put``), or reads rank ``(r + 1) % n``'s window into a local
buffer (``get``). The time is one op's, complete at the target (every backend's put/get here
returns remote-complete, the two-sided emulation's excepted, which completes at the next fence).
Results are checked after a fence. The ``mpi4py`` reference runs the same pattern on a raw MPI
window (``Win.Create``, ``Lock_all``, ``Put``/``Get`` + ``Flush``), see
:class:`commlayer.bench.raw.RawMpiWindow`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from commlayer import dist
from commlayer.core.work import Work
from commlayer.windows import window

__all__ = [
    "BENCH_OPS",
    "FACADE_OPS",
    "WINDOW_OPS",
    "BenchCase",
    "CaseContext",
    "Layout",
    "ValuePattern",
    "check_values_exact",
    "layout",
    "make_case",
]

BENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier", "pingpong")
#: The one-sided ops (``--op put``/``get``): see the window cases below.
WINDOW_OPS = ("put", "get")

#: The facade ops each bench op calls, to check a backend's capabilities before communicating.
FACADE_OPS = {
    "all_reduce": ("all_reduce",),
    "all_gather": ("all_gather_into_tensor",),
    "reduce_scatter": ("reduce_scatter_tensor",),
    "broadcast": ("broadcast",),
    "all_to_all": ("all_to_all_single",),
    "barrier": ("barrier",),
    "pingpong": ("send", "recv"),
    "put": (),  # one-sided windows: every backend has them (native or emulated)
    "get": (),
}

# Ops whose buffer is split into one chunk per rank, so S must be a multiple of n elements.
_CHUNKED = frozenset({"all_gather", "reduce_scatter", "all_to_all"})

# Largest integer each dtype holds exactly (floats: 2**mantissa_bits; ints: their maximum).
_EXACT_LIMIT = {
    torch.float64: 2**53,
    torch.float32: 2**24,
    torch.float16: 2**11,
    torch.bfloat16: 2**8,
    torch.int64: 2**63 - 1,
    torch.int32: 2**31 - 1,
    torch.int16: 2**15 - 1,
    torch.int8: 2**7 - 1,
    torch.uint8: 2**8 - 1,
}
_PATTERN_CAP = 1 << 16  # a longer period buys nothing and costs int64 headroom


def check_values_exact(dtype: torch.dtype, world_size: int) -> None:
    """Raise ValueError unless results in ``dtype`` can be verified exactly at this world size."""
    if dtype not in _EXACT_LIMIT:
        names = ", ".join(sorted(str(known).removeprefix("torch.") for known in _EXACT_LIMIT))
        raise ValueError(f"--dtype: expected one of {names}, received {dtype}")
    if _base_sum(world_size) > _EXACT_LIMIT[dtype]:
        raise ValueError(
            f"--dtype: {dtype} cannot hold the sum over {world_size} ranks exactly, so results could not "
            "be verified; use a wider --dtype"
        )


def _base_sum(world_size: int) -> int:
    """The smallest sum over ranks the pattern produces: sum of (1 + r) for r < n."""
    return world_size + world_size * (world_size - 1) // 2


@dataclass(frozen=True)
class Layout:
    """The message actually sent for a requested size: ``nbytes`` is nccl-tests' S."""

    op: str
    nbytes: int
    count: int  # elements in S
    element_size: int


def layout(op: str, requested_bytes: int, dtype: torch.dtype, world_size: int) -> Layout:
    """Round ``requested_bytes`` down to whole elements (and whole per-rank chunks); at least one.

    >>> layout("all_gather", 12, torch.float32, 2).nbytes   # 3 elements -> 2, one per rank
    8
    """
    element_size = torch.empty((), dtype=dtype).element_size()
    if op == "barrier":
        return Layout(op, 0, 0, element_size)
    count = max(1, requested_bytes // element_size)
    if op in _CHUNKED:
        count = max(world_size, count - count % world_size)
    return Layout(op, count * element_size, count, element_size)


class ValuePattern:
    """The check values of a world of ``world_size`` ranks in ``dtype`` (see the module doc)."""

    def __init__(self, world_size: int, dtype: torch.dtype) -> None:
        self.world_size = world_size
        self.dtype = dtype
        headroom = _EXACT_LIMIT[dtype] - _base_sum(world_size)
        self.period = max(1, min(_PATTERN_CAP, headroom // (world_size * world_size) + 1))

    def pattern(self, start: int, count: int, iteration: int, device: torch.device) -> torch.Tensor:
        """``(i + it) % M`` for i in [start, start + count), as int64."""
        index = torch.arange(start, start + count, dtype=torch.int64, device=device)
        return (index + iteration % self.period) % self.period

    def rank_values(
        self, rank: int, start: int, count: int, iteration: int, device: torch.device
    ) -> torch.Tensor:
        """Rank ``rank``'s elements [start, start + count) at ``iteration``."""
        values = 1 + rank + self.world_size * self.pattern(start, count, iteration, device)
        return values.to(self.dtype)

    def summed(self, start: int, count: int, iteration: int, device: torch.device) -> torch.Tensor:
        """Elements [start, start + count) of the sum over every rank's values."""
        n = self.world_size
        values = n + n * (n - 1) // 2 + n * n * self.pattern(start, count, iteration, device)
        return values.to(self.dtype)


@dataclass(frozen=True)
class CaseContext:
    """Where a case runs: the benchmarked group and this rank's place in it."""

    group: Any  # a commlayer ProcessGroup whose ranks are every world rank
    rank: int
    world_size: int
    device: torch.device
    dtype: torch.dtype
    # Whose calls the cases make: the facade, or a reference of commlayer.bench.raw.
    api: Any = dist


class BenchCase:
    """Buffers of one (op, size); ``fill(it)`` then ``run_op(async_op)`` then ``wrong(it)``."""

    def __init__(self, context: CaseContext, shape: Layout) -> None:
        self.context = context
        self.layout = shape
        self.values = ValuePattern(context.world_size, context.dtype) if shape.count else None

    def _empty(self, count: int) -> torch.Tensor:
        return torch.zeros(count, dtype=self.context.dtype, device=self.context.device)

    def _values_of(self, rank: int, start: int, count: int, iteration: int) -> torch.Tensor:
        """Rank ``rank``'s input elements [start, start + count) at ``iteration``, on our device."""
        assert self.values is not None, "a barrier has no values"
        return self.values.rank_values(rank, start, count, iteration, self.context.device)

    def _mine(self, start: int, count: int, iteration: int) -> torch.Tensor:
        return self._values_of(self.context.rank, start, count, iteration)

    def _sum_over_ranks(self, start: int, count: int, iteration: int) -> torch.Tensor:
        assert self.values is not None, "a barrier has no values"
        return self.values.summed(start, count, iteration, self.context.device)

    def fill(self, iteration: int) -> None:
        """Inputs get this iteration's values; outputs get 0, a value no correct result holds."""

    def run_op(self, async_op: bool) -> Work | None:
        raise NotImplementedError

    def wrong(self, iteration: int) -> int:
        """How many output elements differ from the exact result of ``iteration``."""
        return 0

    @staticmethod
    def _mismatches(actual: torch.Tensor, expected: torch.Tensor) -> int:
        return int(torch.count_nonzero(actual != expected).item())


class AllReduceCase(BenchCase):
    def __init__(self, context: CaseContext, shape: Layout) -> None:
        super().__init__(context, shape)
        self.buffer = self._empty(shape.count)

    def fill(self, iteration: int) -> None:
        self.buffer.copy_(self._mine(0, self.layout.count, iteration))

    def run_op(self, async_op: bool) -> Work | None:
        return self.context.api.all_reduce(self.buffer, group=self.context.group, async_op=async_op)

    def wrong(self, iteration: int) -> int:
        return self._mismatches(self.buffer, self._sum_over_ranks(0, self.layout.count, iteration))


class BroadcastCase(AllReduceCase):
    """Root 0 sends; the others start from zeros so a missed write shows up."""

    def fill(self, iteration: int) -> None:
        if self.context.rank == 0:
            self.buffer.copy_(self._values_of(0, 0, self.layout.count, iteration))
        else:
            self.buffer.zero_()

    def run_op(self, async_op: bool) -> Work | None:
        return self.context.api.broadcast(self.buffer, src=0, group=self.context.group, async_op=async_op)

    def wrong(self, iteration: int) -> int:
        return self._mismatches(self.buffer, self._values_of(0, 0, self.layout.count, iteration))


class ChunkedCase(BenchCase):
    """Ops over one chunk per rank: all_gather, reduce_scatter, all_to_all."""

    def __init__(self, context: CaseContext, shape: Layout) -> None:
        super().__init__(context, shape)
        self.chunk = shape.count // context.world_size
        chunked_input = shape.op in ("reduce_scatter", "all_to_all")
        self.input = self._empty(shape.count if chunked_input else self.chunk)
        self.output = self._empty(self.chunk if shape.op == "reduce_scatter" else shape.count)

    def fill(self, iteration: int) -> None:
        self.input.copy_(self._mine(0, self.input.numel(), iteration))
        self.output.zero_()

    def run_op(self, async_op: bool) -> Work | None:
        group, op = self.context.group, self.layout.op
        if op == "all_gather":
            return self.context.api.all_gather_into_tensor(
                self.output, self.input, group=group, async_op=async_op
            )
        if op == "reduce_scatter":
            return self.context.api.reduce_scatter_tensor(
                self.output, self.input, group=group, async_op=async_op
            )
        return self.context.api.all_to_all_single(self.output, self.input, group=group, async_op=async_op)

    def wrong(self, iteration: int) -> int:
        return self._mismatches(self.output, self._expected(iteration))

    def _expected(self, iteration: int) -> torch.Tensor:
        rank, chunk = self.context.rank, self.chunk
        if self.layout.op == "reduce_scatter":
            return self._sum_over_ranks(rank * chunk, chunk, iteration)
        senders = range(self.context.world_size)
        if self.layout.op == "all_gather":
            return torch.cat([self._values_of(sender, 0, chunk, iteration) for sender in senders])
        # all_to_all: chunk j of my output is chunk <my rank> of rank j's input
        return torch.cat([self._values_of(sender, rank * chunk, chunk, iteration) for sender in senders])


class BarrierCase(BenchCase):
    def run_op(self, async_op: bool) -> Work | None:
        return self.context.api.barrier(group=self.context.group, async_op=async_op)


class PingPongCase(BenchCase):
    """Even rank 2k sends to 2k+1, which echoes it back; both check they hold rank 2k's values."""

    def __init__(self, context: CaseContext, shape: Layout) -> None:
        super().__init__(context, shape)
        self.peer = context.rank ^ 1
        self.active = self.peer < context.world_size
        self.initiator = context.rank % 2 == 0
        self.outgoing = self._empty(shape.count)
        self.incoming = self._empty(shape.count)

    def fill(self, iteration: int) -> None:
        if self.initiator:
            self.outgoing.copy_(self._mine(0, self.layout.count, iteration))
        self.incoming.zero_()

    def run_op(self, async_op: bool) -> Work | None:
        if not self.active:
            return None
        group = self.context.group
        if self.initiator:
            self.context.api.send(self.outgoing, dst=self.peer, group=group)
            self.context.api.recv(self.incoming, src=self.peer, group=group)
        else:
            self.context.api.recv(self.incoming, src=self.peer, group=group)
            self.context.api.send(self.incoming, dst=self.peer, group=group)
        return None

    def wrong(self, iteration: int) -> int:
        if not self.active:
            return 0
        sender = self.context.rank if self.initiator else self.peer
        return self._mismatches(self.incoming, self._values_of(sender, 0, self.layout.count, iteration))


class CopyCase(BenchCase):
    """The memcpy reference: one copy of S bytes, whatever the op (see commlayer.bench.raw)."""

    def __init__(self, context: CaseContext, shape: Layout) -> None:
        super().__init__(context, shape)
        self.source = self._empty(max(1, shape.count))
        self.target = self._empty(max(1, shape.count))

    def fill(self, iteration: int) -> None:
        if self.layout.count:
            self.source.copy_(self._mine(0, self.layout.count, iteration))
        self.target.zero_()

    def run_op(self, async_op: bool) -> Work | None:
        self.context.api.copy(self.target, self.source)
        return None

    def wrong(self, iteration: int) -> int:
        return self._mismatches(self.target, self.source)


# --- one-sided windows: put and get of S bytes to the next rank -------------------------------
def _open_window(context: CaseContext, tensor: torch.Tensor) -> Any:
    """A window over ``tensor``: commlayer's, or the reference's own (collective)."""
    if hasattr(context.api, "window"):
        return context.api.window(tensor)
    return window(tensor, group=context.group)


class WindowCase(BenchCase):
    """put: this rank's ``local`` lands in the next rank's window; get: the next rank's window
    lands in ``local``. Either way the data moves one rank along, and the landing side is checked."""

    def __init__(self, context: CaseContext, shape: Layout) -> None:
        super().__init__(context, shape)
        self.local = self._empty(shape.count)
        self.window = _open_window(context, self._empty(shape.count))
        self.peer = (context.rank + 1) % context.world_size
        self.put = shape.op == "put"
        # Whose values land here: the previous rank puts into this window; a get reads the next's.
        self.writer = (context.rank - 1) % context.world_size if self.put else self.peer
        self.transfer = self.window.put if self.put else self.window.get

    def _sides(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(what this rank writes from, where data lands on this rank)."""
        return (self.local, self.window.tensor) if self.put else (self.window.tensor, self.local)

    def fill(self, iteration: int) -> None:
        written, landing = self._sides()
        written.copy_(self._mine(0, self.layout.count, iteration))
        landing.zero_()
        self.window.fence()

    def run_op(self, async_op: bool) -> Work | None:
        return self.transfer(self.local, self.peer, 0, async_op=async_op)

    def wrong(self, iteration: int) -> int:
        self.window.fence()
        expected = self._values_of(self.writer, 0, self.layout.count, iteration)
        return self._mismatches(self._sides()[1], expected)

    def close(self) -> None:
        self.window.free()


_CASES: dict[str, Callable[[CaseContext, Layout], BenchCase]] = {
    "all_reduce": AllReduceCase,
    "broadcast": BroadcastCase,
    "all_gather": ChunkedCase,
    "reduce_scatter": ChunkedCase,
    "all_to_all": ChunkedCase,
    "barrier": BarrierCase,
    "pingpong": PingPongCase,
    "put": WindowCase,
    "get": WindowCase,
}


def make_case(context: CaseContext, shape: Layout) -> BenchCase:
    if hasattr(context.api, "copy"):
        return CopyCase(context, shape)
    return _CASES[shape.op](context, shape)
