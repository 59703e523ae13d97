"""The sweep's progress bar (tqdm), drawn only when its stream is a terminal.

Under ``-n`` the ranks' output goes through the launcher's pipes, so rank 0 appends its steps to
a file and the parent process, which owns the terminal, draws the bar (:func:`follow_file`).
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

__all__ = ["ProgressBar", "StepFileWriter", "follow_file"]


class ProgressBar:
    """A tqdm bar over ``total`` steps, labelled with the step in flight (``gloo all_reduce 1KiB``)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = _is_terminal(self.stream)
        self._bar = tqdm(total=max(total, 1), file=self.stream, leave=False, disable=not self.enabled)

    def update(self, done: int, label: str) -> None:
        """Show ``done`` steps finished, the latest being ``label``."""
        if not self.enabled:
            return
        self._bar.set_description_str(label[:40], refresh=False)
        self._bar.update(done - self._bar.n)
        self._bar.refresh()  # steps are seconds apart: tqdm's rate limit would hide most of them

    def close(self) -> None:
        self._bar.close()


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
