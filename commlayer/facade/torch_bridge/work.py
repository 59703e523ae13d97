"""torch's Work over a commlayer Work, and the thread that completes its futures in the background.

DDP asks for a bucket's future right after launching the bucket's all-reduce and only waits for
it once backward is done. A future completed by the launching thread (waiting right there) would
serialise every bucket with the backward pass; here a per-group :class:`Completer` thread waits
for the backend's Work and completes the future, so buckets overlap the rest of backward::

    work = BridgeWork.over(commlayer_work, [tensor], completer)
    future = work.get_future()        # returns at once; completed by the group's completer
    future.wait()                     # [tensor], once the backend's op finished

Futures of one group complete in the order their ops were issued, as torch's own backends do.
An op that completes on a CUDA stream (``Work.stream_event``: peermem's kernels) gets a future
completed at once whose consumers' streams wait for the op, as NCCL's futures are, so no thread
and no wait on the caller's stream holds backward back.
An op that is already complete when its future is asked for (every op of a synchronous backend
such as shm) gets an already completed future, without a thread hand-off, unless an earlier
future of the group is still pending.

Overlap needs a core for the library while backward computes: MPI's blocking calls spin while
they wait, and on a rank with one core that spin takes turns with backward (DDP ran 0.16-0.9x the
steps/s of completing futures inline on the 2-core VM, see benchmarks/RESULTS.md).
``COMMLAYER_BRIDGE_FUTURES`` picks: ``background`` (the completer thread), ``inline`` (the thread
that asks for a future waits for the op and completes it), or ``auto`` (the default): background
when this rank has at least two CPUs of its own, else inline. Read when a bridge is created.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as torch_dist
from torch.futures import Future

from commlayer.core import settings
from commlayer.core.errors import invalid_argument
from commlayer.core.rendezvous import RendezvousEnvError, discover
from commlayer.core.work import Work, completed_on_stream

__all__ = ["FUTURES_ENV", "BridgeWork", "Completer", "has_spare_cpu", "inline_futures"]

FUTURES_ENV = settings.BRIDGE_FUTURES.name
_FUTURES_MODES = ("auto", "background", "inline")

_JOIN_TIMEOUT_S = 5.0
_Pending = tuple[Future, Work, list[torch.Tensor]]


def inline_futures(environ: Mapping[str, str]) -> bool:
    """Whether ``$COMMLAYER_BRIDGE_FUTURES`` (and, for ``auto``, this rank's CPUs) asks for inline futures."""
    mode = (settings.BRIDGE_FUTURES.text(environ) or "auto").lower()
    if mode not in _FUTURES_MODES:
        raise invalid_argument(
            "torch bridge", f"${FUTURES_ENV}", f"one of {_FUTURES_MODES}", repr(mode), None
        )
    if mode == "auto":
        host_cpus = os.cpu_count() or 1
        usable = (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else host_cpus
        )  # not on macOS
        return not has_spare_cpu(usable, host_cpus, _local_ranks(environ))
    return mode == "inline"


def has_spare_cpu(usable_cpus: int, host_cpus: int, local_ranks: int) -> bool:
    """Whether a rank has two CPUs or more of its own: one to compute on, one for the library.

    A rank its launcher pinned to fewer CPUs than the host has owns them; one that may run on
    every CPU shares them with the host's other ranks.
    """
    sharing = local_ranks if usable_cpus >= host_cpus else 1
    return usable_cpus >= 2 * max(1, sharing)


def _local_ranks(environ: Mapping[str, str]) -> int:
    try:
        info = discover(environ)
    except RendezvousEnvError:
        info = None
    if info is not None:
        return info.local_world_size
    return int(environ.get("LOCAL_WORLD_SIZE", "1") or 1)


class Completer:
    """Completes the futures of one group's Works, in issue order, on one thread started lazily.

    ``inline``: the thread asking for a future waits for the op and completes it itself.
    """

    def __init__(self, name: str, inline: bool = False) -> None:
        self._name = name
        self._inline = inline
        self._pending: deque[_Pending | None] = deque()  # None stops the thread
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def future_of(self, work: Work, result: list[torch.Tensor]) -> Future:
        """A future holding ``result`` once ``work`` completes (its error if it fails)."""
        # Without the lock: the thread removes a future only once it is complete, so an empty
        # queue means no earlier future of this group is pending.
        if not self._pending:
            on_stream = completed_on_stream(work, result)
            if on_stream is not None:
                return on_stream
        future: Future = Future()
        if self._inline:
            settle(future, work, result)
            return future
        if not self._pending and work.is_completed():
            error = work.exception()
            future.set_result(result) if error is None else future.set_exception(error)
            return future
        with self._changed:
            self._pending.append((future, work, result))
            self._changed.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"commlayer-bridge-{self._name}", daemon=True
                )
                self._thread.start()
        return future

    def close(self) -> None:
        """Stop the thread once every pending future is completed (waits up to a few seconds)."""
        with self._changed:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._pending.append(None)
            self._changed.notify()
        if thread is not threading.current_thread():
            thread.join(_JOIN_TIMEOUT_S)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending:
                    self._changed.wait()
                head = self._pending[0]
            if head is None:
                with self._changed:
                    self._pending.popleft()
                return
            settle(*head)
            with self._changed:
                self._pending.popleft()  # only now: a later op's future must not overtake this one


def settle(future: Future, work: Work, result: list[torch.Tensor]) -> None:
    """Wait for ``work`` (up to its group's timeout) and complete ``future`` with its outcome."""
    try:
        work.wait()
    except BaseException as error:  # noqa: BLE001 - handed to the future's consumer
        future.set_exception(error)
        return
    future.set_result(result)


class BridgeWork(torch_dist.Work):
    """torch's Work over one commlayer Work (several: a :class:`~commlayer.core.work.WorkList`).

    It defines no ``__init__``: pybind's constructor runs alone and :meth:`over` sets the three
    fields, which saves a Python frame and a call into torch on every op. The fields are slots:
    built once per bridged op, a slotted object costs ~0.1 us less than one with a ``__dict__``.
    """

    __slots__ = ("_completer", "_result", "_work")

    _work: Work
    _result: list[torch.Tensor]
    _completer: Completer

    @classmethod
    def over(cls, work: Work, result: list[torch.Tensor], completer: Completer) -> BridgeWork:
        """The torch Work of ``work``, whose result is ``result``; ``completer`` completes its future."""
        bridged = cls()
        bridged._work = work
        bridged._result = result
        bridged._completer = completer
        return bridged

    def wait(self, timeout: timedelta | None = None) -> bool:
        # torch passes timedelta(0) for "no timeout of the call's own".
        return self._work.wait(timeout if timeout else None)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self) -> BaseException | None:
        return self._work.exception()

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> Future:
        return self._completer.future_of(self._work, self._result)

    def _source_rank(self) -> int:
        return self._work.source_rank()

    source_rank = _source_rank
