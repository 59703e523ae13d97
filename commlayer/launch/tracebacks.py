"""Python tracebacks in a process's output, held back so that a failure fits on one screen.

A failing world usually prints one traceback per rank, most of them the same. The supervisor
feeds every line of a rank's stderr to a :class:`TracebackHold`; from the first
``Traceback (most recent call last):`` on, the rank's stderr is held instead of echoed, and the
last exception line is kept. When the world ends, the launcher prints the first failing rank's
held lines in full and one line (its exception) for each other rank (:mod:`.report`); the log
files keep everything. torch's own ``[rankN]: `` prefix is removed from every line, since the
launcher already prefixes each line with its rank. C++ stacks that torch appends to its warnings
are left out of the echo too (the one-line warning stays; the log files keep the stack).
"""

from __future__ import annotations

import re

__all__ = ["MAX_HELD_LINES", "TracebackHold", "strip_torch_prefix"]

MAX_HELD_LINES = 5000  # a runaway writer after its traceback must not exhaust memory
_TORCH_PREFIX = re.compile(r"^\[rank\d+\]: ?")
_TRACEBACK_START = "Traceback (most recent call last):"
# The name before "ValueError: text", "commlayer.core.errors.CommTimeoutError: text" or "KeyboardInterrupt".
_EXCEPTION_NAME = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*")
# A C++ stack that torch appends to a warning (e.g. the store's "Broken pipe" when rank 0 is gone).
_NATIVE_STACK = re.compile(
    r"Exception raised from .*\(most recent call first\):|frame #\d+: .*|<omitting python frames>"
)
_EXCEPTION_SUFFIXES = ("Error", "Exception", "Interrupt", "Exit", "Warning")
_CHAIN_HEADERS = ("The above exception was", "During handling of the above exception")


def strip_torch_prefix(line: str) -> str:
    """``"[rank0]: Traceback ..."`` -> ``"Traceback ..."`` (torch's excepthook and log prefix)."""
    return _TORCH_PREFIX.sub("", line, count=1)


class TracebackHold:
    """The held part of one process's stderr and the exception it ended with.

    An exception raised from native code has no traceback of its own, so a chain can begin
    with a bare exception line (``commlayer.core.errors.CommError: ...``, a blank line, then
    ``The above exception was the direct cause ...``): a line that looks like an exception is
    kept back until the next lines say whether a chain begins there.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.exception: str | None = None  # "ValueError: text" of the last traceback seen
        self._after_exception = False
        self._in_native_stack = False
        self._pending: list[str] = []  # a bare exception line and the blank lines after it

    @property
    def holding(self) -> bool:
        return bool(self.lines)

    def feed(self, line: str) -> list[str]:
        """Take one line (without its newline); return the lines to echo now (the others are
        held, or dropped when they are a C++ stack)."""
        if _NATIVE_STACK.fullmatch(line) or (self._in_native_stack and not line.strip()):
            self._in_native_stack = bool(line.strip())
            return []
        self._in_native_stack = False
        if (
            self.lines
            or line.startswith(_TRACEBACK_START)
            or (self._pending and line.startswith(_CHAIN_HEADERS))
        ):
            for held in [*self._pending, line]:
                self._hold(held)
            self._pending = []
            return []
        if self._pending and not line.strip():
            self._pending.append(line)
            return []
        released, self._pending = self._pending, []
        if _looks_like_exception(line):
            self._pending = [line]
            return released
        return [*released, line]

    def flush(self) -> list[str]:
        """At the end of the stream: the lines still kept back, to echo."""
        released, self._pending = self._pending, []
        return released

    def _hold(self, line: str) -> None:
        if len(self.lines) < MAX_HELD_LINES:
            self.lines.append(line)
        self._note_exception(line)

    def _note_exception(self, line: str) -> None:
        if line.startswith((_TRACEBACK_START, *_CHAIN_HEADERS)) or not line.strip():
            self._after_exception = False
            return
        if line[0].isspace():
            return
        if self._after_exception:
            return  # a continuation line of a multi-line message
        if _EXCEPTION_NAME.fullmatch(line.split(":", 1)[0]):
            self.exception = _short_name(line)
            self._after_exception = True


def _looks_like_exception(line: str) -> bool:
    """``"pkg.mod.SomeError: text"``: a dotted name, or one ending like Python's exception names."""
    name = line.split(":", 1)[0]
    return bool(_EXCEPTION_NAME.fullmatch(name)) and ("." in name or name.endswith(_EXCEPTION_SUFFIXES))


def _short_name(line: str) -> str:
    """``"commlayer.core.errors.CommTimeoutError: x"`` -> ``"CommTimeoutError: x"`` (already unique)."""
    name, colon, message = line.partition(":")
    return name.rsplit(".", 1)[-1] + colon + message
