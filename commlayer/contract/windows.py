"""What a backend's one-sided window is: the object behind ``commlayer.window(tensor, group)``.

A backend returns one from :meth:`commlayer.contract.backend.Backend.window`; the default is the two-sided
emulation in :mod:`.emulated_windows`. The user-facing layer (:mod:`commlayer.windows`) has validated
every argument before a method here runs: ranks are group ranks, offsets and sizes fit the
target's window, dtypes match the window's and tensors are contiguous.

The rules a backend's window follows, all of them:

- Creation is collective over the group; ``spec.sizes`` already holds every rank's element count.
- ``tensor`` is the memory peers write into and read from: the registered tensor itself, or a
  copy of it in memory the peers can reach (``shm``: a shared-memory segment), initialised from it.
- ``put`` and ``get`` move ``src.numel()`` elements at element ``offset`` of the peer's window.
  Their Work completes once the caller's buffer may be reused (``put``) or holds the data (``get``).
- ``signal(dst)`` is ordered after every earlier ``put`` from this rank to ``dst``: once ``dst``'s
  ``wait_signal`` for it returns, those puts are visible in ``dst``'s window. Signals count: each
  ``wait_signal(src)`` consumes exactly one ``signal`` from ``src``.
- ``fence()`` is collective: when it returns, every put and get issued by any rank before its fence
  is complete and visible.
- A window may complete remote effects lazily, as the two-sided emulation does (a put lands at the
  target's next ``wait_signal`` from the origin or ``fence``), but never later than those points.
- Every wait is bounded: ``wait_signal`` raises :class:`~commlayer.core.errors.CommTimeoutError` naming
  the peer after ``timeout_s``; every other wait ends by the group's timeout.
- ``map(peer)`` returns a tensor viewing the peer's window memory where the ranks share memory
  (``mappable`` is True), else raises UnsupportedError.
- Operations on oneself are allowed and act on the local window.
- ``fast_put`` and ``fast_get`` (optional, None by default) take the user's own arguments
  ``(tensor, rank, offset)``, with ``rank`` a *global* rank, for a blocking put or get. Each checks
  everything the user layer would (a contiguous tensor of the window's dtype on its device, a
  member rank, an int offset whose span fits) and either completes the op and returns True, or
  does nothing and returns False; the user layer then validates and calls ``put``/``get``.

A GPU backend with peer-to-peer memory (NVLink/IPC handles) plugs in by overriding
``Backend.window`` to return its own :class:`BackendWindow`: ``put``/``get`` as device copies into
the peer's mapped allocation, signals as device-memory flags, ``map`` as the mapped allocation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch

from commlayer.core.errors import CommTimeoutError, UnsupportedError
from commlayer.core.work import Work, poll_until, to_seconds

__all__ = ["BackendWindow", "PollWork", "WindowSpec"]


@dataclass(frozen=True)
class WindowSpec:
    """What the user layer tells a backend about a new window (the same on every member).

    Args:
        key: a name unique to this window and equal on every member (namespaces store keys).
        index: the window's position among the group's windows (0, 1, ...), for tags.
        rank: this process's group rank.
        sizes: every group rank's element count, in group order.
        timeout_s: the group's timeout: the bound of every wait but ``wait_signal``'s own.
        global_rank: this process's global rank, for messages.
        global_ranks: the group's global ranks in group order, for messages.
    """

    key: str
    index: int
    rank: int
    sizes: tuple[int, ...]
    timeout_s: float
    global_rank: int
    global_ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        """The number of ranks in the group."""
        return len(self.sizes)


class PollWork(Work):
    """A window op completed by polling ``test``; an untimed wait ends at ``limit_s`` with ``expired``.

    A caller's timeout shorter than that leaves the op pending, so it can be waited for again.
    """

    _pending_note = "; the op is still pending and can be waited for again"

    def __init__(self, test: Callable[[], bool], limit_s: float, expired: Callable[[], Exception]) -> None:
        super().__init__()
        self._poll = test
        self._limit_s = limit_s
        self._expired = expired

    def _test(self) -> bool:
        return self._poll()

    def _block(self, timeout_s: float | None) -> bool:
        if poll_until(self._poll, self._limit_s if timeout_s is None else timeout_s):
            return True
        if timeout_s is None:
            raise self._expired()
        return False


def signal_timeout(spec: WindowSpec, src: int, timeout_s: float) -> CommTimeoutError:
    """The error of a ``wait_signal`` whose signal did not come."""
    return CommTimeoutError(
        f"wait_signal: no signal from rank {spec.global_ranks[src]} arrived within {timeout_s:g} s "
        f"(rank {spec.global_rank}, window '{spec.key}'); the peer failed or never signalled"
    )


def group_timeout(op: str, spec: WindowSpec, peer: int | None = None) -> CommTimeoutError:
    """The error of a window op that did not complete within the group's timeout."""
    who = "" if peer is None else f" waiting for rank {spec.global_ranks[peer]}"
    return CommTimeoutError(
        f"{op}: the window op did not complete within the group's timeout of {spec.timeout_s:g} s"
        f"{who} (rank {spec.global_rank}, window '{spec.key}'); a peer failed or stopped making "
        "window calls"
    )


def limit_of(timeout: timedelta | float | None, default_s: float) -> float:
    """``timeout`` in seconds, or ``default_s`` when None."""
    seconds = to_seconds(timeout)
    return default_s if seconds is None else seconds


class BackendWindow(ABC):
    """One rank's side of a window; every rank argument is a group rank (see the module's rules)."""

    #: Whether :meth:`map` works: the ranks share this window's memory.
    mappable: bool = False
    #: Blocking ``put``/``get`` that check their own arguments: see the module's rules.
    fast_put: Callable[[torch.Tensor, int, int], bool] | None = None
    fast_get: Callable[[torch.Tensor, int, int], bool] | None = None

    def __init__(self, tensor: torch.Tensor, spec: WindowSpec) -> None:
        self.tensor = tensor
        self.spec = spec

    @abstractmethod
    def put(self, src: torch.Tensor, dst: int, offset: int, *, async_op: bool) -> Work:
        """Write contiguous ``src`` into ``dst``'s window at element ``offset``."""

    @abstractmethod
    def get(self, out: torch.Tensor, src: int, offset: int, *, async_op: bool) -> Work:
        """Read ``out.numel()`` elements of ``src``'s window at element ``offset`` into contiguous ``out``."""

    @abstractmethod
    def signal(self, dst: int, *, async_op: bool) -> Work:
        """Tell ``dst`` that this rank's earlier puts to it are complete."""

    @abstractmethod
    def wait_signal(self, src: int, timeout_s: float, *, async_op: bool) -> Work:
        """Consume one signal from ``src``; its wait raises CommTimeoutError after ``timeout_s``."""

    @abstractmethod
    def fence(self, *, async_op: bool) -> Work:
        """Collective: complete every put and get issued by any rank before it."""

    def map(self, peer: int) -> torch.Tensor:
        """A tensor viewing ``peer``'s window memory (only where ``mappable``)."""
        raise UnsupportedError(
            f"map: this window's ranks do not share memory (rank {self.spec.global_rank}, window "
            f"'{self.spec.key}'); use get/put"
        )

    def close(self) -> None:
        """Release the window's resources (not collective; the user layer fences first)."""
