"""Async handles returned by every op, whatever the library underneath.

A backend wraps its library's request (a torch Work, an MPI request, a oneCCL event) in one of the
small adapters here; the facade chains epilogues onto it (copy a staged output back, divide for
AVG) with :meth:`Work.then`, so callers see one behaviour on every backend.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

from .errors import CommTimeoutError

__all__ = ["CompletedWork", "PolledWork", "TorchWork", "Work", "WorkList", "to_seconds"]

# Epilogues run once, under one process-wide lock: completion is rare next to launching, and a
# lock per Work would cost every call an allocation. Re-entrant, as an epilogue may wait on others.
_COMPLETION_LOCK = threading.RLock()


def to_seconds(timeout: timedelta | float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


class Work(ABC):
    """Handle of an operation in flight, shaped like ``torch.distributed.Work``."""

    # Class-level defaults, shadowed per instance on completion: one Work is built per op, so
    # its constructor stays a single assignment.
    _done: bool = False
    _error: BaseException | None = None

    def __init__(self, result: Sequence[torch.Tensor] = ()) -> None:
        self._result = result

    @abstractmethod
    def _test(self) -> bool:
        """Return True once the operation has completed; never blocks."""

    @abstractmethod
    def _block(self, timeout_s: float | None) -> bool:
        """Block until completion; return False if ``timeout_s`` seconds passed first."""

    def _on_complete(self) -> None:
        """Hook for subclasses that run an epilogue exactly once after completion."""

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until done; raise CommTimeoutError if ``timeout`` passes first."""
        if not self._done:
            if not self._block(to_seconds(timeout)):
                raise CommTimeoutError(f"{type(self).__name__}: wait timed out after {timeout}")
            self._complete()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if not self._done and self._test():
            self._complete()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return list(self._result)

    def _source_rank(self) -> int:
        """torch's spelling of ``source_rank()``: the sender of a receive from any source."""
        return self.source_rank()  # type: ignore[attr-defined] - receive works define it

    def then(self, epilogue: Callable[[], None], result: Sequence[torch.Tensor] | None = None) -> Work:
        """A Work that runs ``epilogue`` once, after this one completes and before it reports done.

        Its ``result()`` is this Work's, unless ``result`` names other tensors (a staged op hands
        back the caller's tensors, not its staging copies).
        """
        return _ChainedWork(self, epilogue, result)

    def get_future(self) -> torch.futures.Future:
        """A future holding :meth:`result` once the op completes (waited for on a helper thread)."""
        future: torch.futures.Future = torch.futures.Future()

        def settle() -> None:
            try:
                self.wait()
                future.set_result(self.result())
            except BaseException as error:  # noqa: BLE001 - handed to the future's consumer
                future.set_exception(error)

        if self.is_completed():
            settle()
        else:
            threading.Thread(target=settle, daemon=True, name="commlayer-future").start()
        return future

    def _complete(self) -> None:
        with _COMPLETION_LOCK:
            if self._done:
                return
            try:
                self._on_complete()
            except BaseException as error:  # noqa: BLE001 - re-raised from wait()
                self._error = error
            self._done = True


class CompletedWork(Work):
    """An op that finished synchronously (or had nothing to send)."""

    _done = True

    def _test(self) -> bool:
        return True

    def _block(self, timeout_s: float | None) -> bool:
        return True


class TorchWork(Work):
    """Adapter for a ``torch.distributed`` Work."""

    def __init__(self, work: Any, result: Sequence[torch.Tensor] = ()) -> None:
        # Built once per async op on the hot path: assignments only, no super() frame.
        self._result = result
        self.torch_work = work

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Untimed, not yet done: torch's own wait is all there is to do (no epilogue here)."""
        if timeout is None and not self._done:
            self.torch_work.wait()  # raises on failure, and on the group's timeout, as torch does
            self._done = True  # never wait twice: a second wait on a finished gloo recv blocks
            return True
        return super().wait(timeout)

    def _test(self) -> bool:
        return bool(self.torch_work.is_completed())

    def _block(self, timeout_s: float | None) -> bool:
        if timeout_s is None:
            return bool(self.torch_work.wait())
        try:
            return bool(self.torch_work.wait(timedelta(seconds=timeout_s)))
        except RuntimeError as error:
            if "timed out" in str(error).lower() or "timeout" in str(error).lower():
                return False
            raise

    def source_rank(self) -> int:
        return int(self.torch_work._source_rank())


class PolledWork(Work):
    """Adapter for a library request exposed as ``test()`` and a blocking ``wait()``.

    ``wait_fn`` blocks without a deadline (MPI and oneCCL waits have none), so a timed wait falls
    back to polling ``test_fn`` with a short back-off: it never blocks past the deadline.
    """

    def __init__(
        self,
        test_fn: Callable[[], bool],
        wait_fn: Callable[[], None],
        result: Sequence[torch.Tensor] = (),
    ) -> None:
        super().__init__(result)
        self._test_fn = test_fn
        self._wait_fn = wait_fn

    def _test(self) -> bool:
        return bool(self._test_fn())

    def _block(self, timeout_s: float | None) -> bool:
        if timeout_s is None:
            self._wait_fn()
            return True
        deadline = time.monotonic() + timeout_s
        pause = 1e-6
        while not self._test_fn():
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        return True


class WorkList(Work):
    """Completes when every member completes; used by fallbacks built from several core ops."""

    def __init__(self, works: Sequence[Work], result: Sequence[torch.Tensor] = ()) -> None:
        super().__init__(result)
        self._works = list(works)

    def _test(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def _block(self, timeout_s: float | None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for work in self._works:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                work.wait(remaining)
            except CommTimeoutError:
                return False
        return True


class _ChainedWork(Work):
    def __init__(
        self, base: Work, epilogue: Callable[[], None], result: Sequence[torch.Tensor] | None
    ) -> None:
        super().__init__(base.result() if result is None else result)
        self._base = base
        self._epilogue = epilogue

    def _test(self) -> bool:
        return self._base.is_completed()

    def _block(self, timeout_s: float | None) -> bool:
        try:
            return self._base.wait(timeout_s)
        except CommTimeoutError:
            return False

    def _on_complete(self) -> None:
        self._base.wait()
        self._epilogue()

    def source_rank(self) -> int:
        return self._base.source_rank()  # type: ignore[attr-defined]
