"""A one-line progress bar for long sweeps; silent unless its stream is a terminal.

Under ``-n`` the ranks' output goes through the launcher's pipes, so rank 0 appends its steps to
a file and the parent process, which owns the terminal, draws the bar (:func:`follow_file`).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TextIO

__all__ = ["ProgressBar", "StepFileWriter", "follow_file"]

_WIDTH = 30


class ProgressBar:
    """``[#########.....]  12/40  gloo all_reduce 1024B`` redrawn in place with a carriage return."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = max(total, 1)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_terminal(self.stream)
        self._drawn = False

    def update(self, done: int, label: str) -> None:
        if not self.enabled:
            return
        filled = min(_WIDTH, _WIDTH * done // self.total)
        bar = "#" * filled + "." * (_WIDTH - filled)
        self.stream.write(f"\r[{bar}] {done:>4}/{self.total}  {label[:40]:<40}")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r" + " " * (_WIDTH + 60) + "\r")
            self.stream.flush()
            self._drawn = False


class StepFileWriter:
    """Rank 0's side under ``-n``: one ``done<TAB>label`` line per step."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __call__(self, done: int, label: str) -> None:
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(f"{done}\t{label}\n")


def follow_file(path: str | Path, bar: ProgressBar, stop: threading.Event, poll_s: float = 0.2) -> None:
    """Redraw ``bar`` from the last line of ``path`` until ``stop`` is set (run on a thread)."""
    shown = 0
    while True:
        stopping = stop.wait(poll_s)
        shown = _redraw_from(path, bar, shown)
        if stopping:
            break
    bar.close()


def _redraw_from(path: str | Path, bar: ProgressBar, shown: int) -> int:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return shown
    if len(lines) > shown and "\t" in lines[-1]:
        done, label = lines[-1].split("\t", 1)
        bar.update(int(done), label)
        return len(lines)
    return shown


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
