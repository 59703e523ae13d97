"""Benchmark cases of one-sided windows: ``put`` and ``get`` of S bytes to the next rank.

Every rank registers a window of S bytes; rank ``r`` puts its values into rank ``(r + 1) % n``'s
window (``put``), or reads rank ``(r + 1) % n``'s window into a local buffer (``get``). The time
is one op's, complete at the target (every backend's put/get here returns remote-complete, the
two-sided emulation's excepted, which completes at the next fence). Results are checked after a
fence. The ``mpi4py`` reference runs the same pattern on a raw MPI window (``Win.Create``,
``Lock_all``, ``Put``/``Get`` + ``Flush``), see :class:`commlayer.bench.raw.RawMpiWindow`.
"""

from __future__ import annotations

from typing import Any

import torch

from commlayer.bench.cases import BenchCase, CaseContext, Layout
from commlayer.core.work import Work

__all__ = ["WINDOW_CASES", "WINDOW_OPS"]

WINDOW_OPS = ("put", "get")


def _open_window(context: CaseContext, tensor: torch.Tensor) -> Any:
    """A window over ``tensor``: commlayer's, or the reference's own (collective)."""
    if hasattr(context.api, "window"):
        return context.api.window(tensor)
    import commlayer  # the facade's user layer sits above the bench's lower imports

    return commlayer.window(tensor, group=context.group)


class _WindowCase(BenchCase):
    def __init__(self, context: CaseContext, shape: Layout) -> None:
        super().__init__(context, shape)
        self.local = self._empty(shape.count)
        self.window = _open_window(context, self._empty(shape.count))
        self.peer = (context.rank + 1) % context.world_size
        self.source = (context.rank - 1) % context.world_size

    def close(self) -> None:
        self.window.free()


class PutCase(_WindowCase):
    def fill(self, iteration: int) -> None:
        self.local.copy_(self._mine(0, self.layout.count, iteration))
        self.window.tensor.zero_()
        self.window.fence()

    def launch(self, async_op: bool) -> Work | None:
        return self.window.put(self.local, self.peer, 0, async_op=async_op)

    def wrong(self, iteration: int) -> int:
        self.window.fence()
        expected = self._values_of(self.source, 0, self.layout.count, iteration)
        return self._mismatches(self.window.tensor, expected)


class GetCase(_WindowCase):
    def fill(self, iteration: int) -> None:
        self.window.tensor.copy_(self._mine(0, self.layout.count, iteration))
        self.local.zero_()
        self.window.fence()

    def launch(self, async_op: bool) -> Work | None:
        return self.window.get(self.local, self.peer, 0, async_op=async_op)

    def wrong(self, iteration: int) -> int:
        self.window.fence()
        expected = self._values_of(self.peer, 0, self.layout.count, iteration)
        return self._mismatches(self.local, expected)


WINDOW_CASES = {"put": PutCase, "get": GetCase}
