"""The flight-recorder watchdog: a thread that dumps this rank's rings while its main thread cannot.

A rank stuck in a collective sits in native code (gloo's wait, shm's spin, an MPI or oneCCL call)
with the GIL released, and a Python signal handler runs only once that call returns. This thread
dumps instead, as torch's NCCL watchdog does (``TORCH_NCCL_DUMP_ON_TIMEOUT``):

* **SIGUSR1**: the facade points Python's signal wakeup fd at this thread's pipe
  (``signal.set_wakeup_fd``), so the C-level handler's byte wakes the thread whichever thread
  the kernel delivered the signal to; the Python handler, when the main thread runs it later,
  only tells the thread it ran (a signal the wakeup fd missed is dumped then, never twice);
* **a collective's timeout**: an op still running past its group's timeout (looked for every
  :data:`POLL_S`), dumped once;
* **requests** from any thread (:func:`request_dump`): the facade asks on a peer's death, once
  the rank has communicated; a backend about to end the job dumps at once, on its own thread
  (:func:`dump_now`).

The dump reads the rings as they are (lists, read under the GIL), never waiting on the blocked
thread. The facade starts the thread at init (:func:`start`) with its dump and overdue checks.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import signal
import threading
from collections.abc import Callable

__all__ = ["POLL_S", "attach_signal_wakeup", "dump_now", "note_signal_handler_ran", "request_dump", "start"]

log = logging.getLogger("commlayer.dist")

POLL_S = 1.0  # how often overdue ops are looked for
_REQUEST = 0  # a byte that says "requests are queued" (signal numbers are 1..64)
_HANDLER_RAN = 255  # the main thread's SIGUSR1 handler ran
_DUMP_SIGNAL = signal.SIGUSR1

Dump = Callable[[str], object]
# Returns (key, reason) for each op that has run past its group's timeout.
Overdue = Callable[[], list[tuple[object, str]]]


class _Watchdog:
    def __init__(self, dump: Dump, overdue: Overdue) -> None:
        self.dump = dump
        self.overdue = overdue
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)
        self.requests: collections.deque[str] = collections.deque()
        self.signals_seen = 0  # SIGUSR1 bytes from the wakeup fd
        self.handler_runs = 0  # SIGUSR1 handler runs on the main thread
        self.dumped_overdue: set[object] = set()
        self.signal_handler: object = None  # SIGUSR1 dumps while this is the signal's handler
        self.pid = os.getpid()
        self.thread = threading.Thread(target=self._run, name="commlayer-watchdog", daemon=True)

    def post(self, byte: int) -> None:
        try:
            os.write(self.write_fd, bytes((byte,)))
        except (BlockingIOError, OSError):  # a full pipe already holds a wake-up
            pass

    def _run(self) -> None:
        while True:
            readable, _, _ = select.select([self.read_fd], [], [], POLL_S)
            if readable:
                self._read_pipe()
            self._dump_overdue()

    def _read_pipe(self) -> None:
        try:
            received = os.read(self.read_fd, 4096)
        except BlockingIOError:
            return
        for byte in received:
            if byte == _DUMP_SIGNAL and signal.getsignal(_DUMP_SIGNAL) is self.signal_handler:
                self.signals_seen += 1
                self._dump("SIGUSR1")
            elif byte == _HANDLER_RAN:
                self.handler_runs += 1
                if self.handler_runs > self.signals_seen:  # the wakeup fd is another's, or was full
                    self.signals_seen = self.handler_runs
                    self._dump("SIGUSR1")
        while self.requests:
            self._dump(self.requests.popleft())

    def _dump_overdue(self) -> None:
        try:
            overdue = self.overdue()
        except Exception as problem:  # noqa: BLE001 - a group torn down meanwhile; look again later
            log.debug("commlayer: the watchdog could not read the rings: %s", problem)
            return
        for key, reason in overdue:
            if key not in self.dumped_overdue:
                self.dumped_overdue.add(key)
                self._dump(reason)

    def _dump(self, reason: str) -> None:
        try:
            self.dump(reason)
        except Exception as problem:  # noqa: BLE001 - the watchdog must outlive a failed dump
            log.warning("commlayer: flight recorder dump failed: %s", problem)


_watchdog: _Watchdog | None = None
_lock = threading.Lock()


def start(dump: Dump, overdue: Overdue) -> None:
    """Run the watchdog of this process with ``dump(reason)`` and ``overdue()`` (a new world's)."""
    global _watchdog
    with _lock:
        if _watchdog is not None and _watchdog.pid == os.getpid():
            _watchdog.dump, _watchdog.overdue = dump, overdue
            _watchdog.dumped_overdue.clear()
            return
        _watchdog = _Watchdog(dump, overdue)
        _watchdog.thread.start()


def attach_signal_wakeup(handler: object) -> bool:
    """Point Python's signal wakeup fd at the watchdog (main thread only), which then dumps on
    SIGUSR1 while ``handler`` (the facade's) handles it. False when another wakeup fd is in use:
    SIGUSR1 is then dumped once the main thread runs the handler."""
    watchdog = _watchdog
    if watchdog is None or threading.current_thread() is not threading.main_thread():
        return False
    watchdog.signal_handler = handler
    previous = signal.set_wakeup_fd(watchdog.write_fd, warn_on_full_buffer=False)
    if previous not in (-1, watchdog.write_fd):
        signal.set_wakeup_fd(previous)  # an event loop's: leave it to it
        return False
    return True


def note_signal_handler_ran() -> None:
    """The main thread's SIGUSR1 handler ran: dump unless the wakeup fd already woke the watchdog."""
    watchdog = _watchdog
    if watchdog is not None and watchdog.pid == os.getpid():
        watchdog.post(_HANDLER_RAN)


def request_dump(reason: str) -> None:
    """Ask the watchdog to dump (returns at once; safe from any thread)."""
    watchdog = _watchdog
    if watchdog is not None and watchdog.pid == os.getpid():
        watchdog.requests.append(reason)
        watchdog.post(_REQUEST)


def dump_now(reason: str) -> None:
    """Dump on the calling thread, at once (a backend about to end the job)."""
    watchdog = _watchdog
    if watchdog is not None and watchdog.pid == os.getpid():
        watchdog._dump(reason)


def _forget_in_child() -> None:
    # A forked child has no watchdog thread; its signals must not wake the parent's.
    global _watchdog
    watchdog, _watchdog = _watchdog, None
    if watchdog is None:
        return
    for fd in (watchdog.read_fd, watchdog.write_fd):
        os.close(fd)
    try:
        previous = signal.set_wakeup_fd(-1)
        if previous != watchdog.write_fd:
            signal.set_wakeup_fd(previous)
    except ValueError:  # forked from another thread than the main one
        pass


os.register_at_fork(after_in_child=_forget_in_child)
