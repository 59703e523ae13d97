"""Process-wide hooks: SIGUSR1 dumps the rings (through the watchdog thread, also while the main
thread is blocked in a collective), an uncaught communication error dumps them at exit, a
torch Work's failed wait raises a typed error, and under ``commlayer run``'s mpirun the output is
written in whole lines."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

from commlayer.core import settings, watchdog
from commlayer.core.errors import CommError
from commlayer.core.work import set_wait_error_hook
from commlayer.facade.calls.failures import typed_wait_error
from commlayer.facade.monitor.dumps import dump_flight_recorder, dumps_for, has_recorded_ops

__all__ = ["install_handlers"]

log = logging.getLogger("commlayer.dist")


def install_handlers() -> None:
    """SIGUSR1 dumps the rings (when nobody else handles it) from the watchdog thread; an
    uncaught communication error dumps at exit; a torch Work's failed wait raises a typed error
    naming op, group and rank. The watchdog must be started."""
    set_wait_error_hook(typed_wait_error)
    on_main_thread = threading.current_thread() is threading.main_thread()
    if on_main_thread and signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None, _on_sigusr1):
        signal.signal(signal.SIGUSR1, _on_sigusr1)
        watchdog.attach_signal_wakeup(_on_sigusr1)
    if not isinstance(sys.excepthook, _DumpingExceptHook):
        sys.excepthook = _DumpingExceptHook(sys.excepthook)
    if settings.LINE_BUFFERED.value():
        _write_whole_lines()


def _write_whole_lines() -> None:
    """One write per line: mpirun labels each write of a rank, so a line written in pieces (stdout
    is block-buffered in a pipe; a traceback is printed piece by piece) would be cut by labels."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)


def _on_sigusr1(signum: int, frame: Any) -> None:
    # The watchdog has dumped already when the wakeup fd woke it; else it dumps now.
    watchdog.note_signal_handler_ran()


class _DumpingExceptHook:
    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], value: BaseException, trace: Any) -> None:
        if isinstance(value, CommError) and dumps_for(value) and has_recorded_ops():
            try:
                dump_flight_recorder(reason=f"uncaught {kind.__name__}: {value}")
            except Exception as problem:  # noqa: BLE001 - never mask the original traceback
                log.warning("commlayer: flight recorder dump failed: %s", problem)
        self.previous(kind, value, trace)
