"""The sweep's progress: a tqdm bar on a terminal, else a line every few seconds.

When stderr is a terminal and tqdm (commlayer's optional ``bench`` part) is installed, a bar is
drawn there; otherwise (a pipe, a log file, or no tqdm) a line such as
``commlayer bench: 12/40 steps, gloo all_reduce 1024B`` is written to stderr at most every
``$COMMLAYER_BENCH_PROGRESS_EVERY`` seconds (default 10). Under ``-n`` the ranks' output goes
through the launcher's pipes, so rank 0 appends its steps and finished rows to a file and the
parent process draws the progress and prints the rows (:func:`follow_file`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from commlayer.core import settings

__all__ = ["PROGRESS_EVERY_ENV", "ProgressBar", "StepFileWriter", "follow_file"]

PROGRESS_EVERY_ENV = settings.BENCH_PROGRESS_EVERY.name
_ROW = "row"  # a progress file line "row<TAB>{record and device as JSON}"


class ProgressBar:
    """Progress over ``total`` steps, labelled with the latest step (``gloo all_reduce 1KiB``)."""

    def __init__(self, total: int, stream: TextIO | None = None, terminal: bool | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.total = max(total, 1)
        on_terminal = _is_terminal(self.stream) if terminal is None else terminal
        self._bar = _tqdm_bar(self.total, self.stream) if on_terminal else None
        self.every_s = _progress_every()
        self._last_line = time.monotonic()

    def update(self, done: int, label: str) -> None:
        """Show ``done`` steps finished, the latest being ``label``."""
        if self._bar is not None:
            self._bar.set_description_str(label[:40], refresh=False)
            self._bar.update(done - self._bar.n)
            self._bar.refresh()  # steps are seconds apart: tqdm's rate limit would hide most of them
            return
        now = time.monotonic()
        if now - self._last_line >= self.every_s or done == self.total:
            self._last_line = now
            print(f"commlayer bench: {done}/{self.total} steps, {label}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class StepFileWriter:
    """Rank 0's side under ``-n``: one ``done<TAB>label`` line per step, one ``row<TAB>json`` per row."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __call__(self, done: int, label: str) -> None:
        self._append(f"{done}\t{label}\n")

    def row(self, record: Any, device: str) -> None:
        self._append(f"{_ROW}\t{json.dumps({'record': record.as_dict(), 'device': device})}\n")

    def _append(self, line: str) -> None:
        with open(self.path, "a", encoding="utf-8") as stream:
            stream.write(line)


def follow_file(
    path: str | Path,
    bar: ProgressBar,
    stop: threading.Event,
    on_row: Callable[[dict[str, Any], str], None] | None = None,
    poll_s: float = 0.2,
) -> None:
    """Replay the lines ``path`` gains (steps to ``bar``, rows to ``on_row``) until ``stop`` is set."""
    offset = 0
    while True:
        stopping = stop.wait(poll_s)
        offset = _replay_from(Path(path), offset, bar, on_row)
        if stopping:
            break
    bar.close()


def _replay_from(
    path: Path, offset: int, bar: ProgressBar, on_row: Callable[[dict[str, Any], str], None] | None
) -> int:
    try:
        with open(path, encoding="utf-8") as stream:
            stream.seek(offset)
            text = stream.read()
    except FileNotFoundError:
        return offset
    complete = text[: text.rfind("\n") + 1]  # a line still being written waits for the next poll
    for line in complete.splitlines():
        kind, _, value = line.partition("\t")
        if kind == _ROW and on_row is not None:
            row = json.loads(value)
            on_row(row["record"], row["device"])
        elif kind.isdigit():
            bar.update(int(kind), value)
    return offset + len(complete.encode("utf-8"))


def _tqdm_bar(total: int, stream: TextIO) -> Any:
    try:
        from tqdm import tqdm  # the optional "bench" part: without it, progress lines instead
    except ModuleNotFoundError:
        return None
    return tqdm(total=total, file=stream, leave=False)


def _progress_every() -> float:
    return max(float(settings.BENCH_PROGRESS_EVERY.value()), 0.0)


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
