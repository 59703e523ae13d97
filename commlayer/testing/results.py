"""The results directory through which ranks tell run_world what happened to them.

Per rank, written atomically by the worker (``worker.py``) and read by the parent (``harness.py``):

    rank3.started     pid of the rank, written before the target is imported
    rank3.traceback   the formatted exception, when the target (or init) raised
    rank3.done        written after the target returned (and the process group was destroyed)

Exit codes alone cannot tell a Python exception from a crash, and under mpirun the parent sees no
per-rank exit codes at all; these files can.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from commlayer.core import settings
from commlayer.launch import pid_running

__all__ = ["RESULTS_DIR_ENV", "ResultsDir"]

RESULTS_DIR_ENV = settings.TESTING_RESULTS_DIR.name


@dataclass(frozen=True)
class ResultsDir:
    path: Path

    def mark_started(self, rank: int, pid: int) -> None:
        self._write(rank, "started", str(pid))

    def mark_done(self, rank: int) -> None:
        self._write(rank, "done", "")

    def write_traceback(self, rank: int, text: str) -> None:
        self._write(rank, "traceback", text)

    def tracebacks(self) -> dict[int, str]:
        return {
            rank: self._file(rank, "traceback").read_text(encoding="utf-8")
            for rank in self._ranks("traceback")
        }

    def started(self) -> dict[int, int]:
        """rank -> pid of every rank that got as far as starting the worker."""
        return {
            rank: int(self._file(rank, "started").read_text(encoding="ascii"))
            for rank in self._ranks("started")
        }

    def done(self) -> set[int]:
        return self._ranks("done")

    def vanished(self) -> list[int]:
        """Ranks that started, did not finish and whose process is gone: os._exit, a crash, a kill."""
        finished = self.done() | self._ranks("traceback")
        return sorted(
            rank for rank, pid in self.started().items() if rank not in finished and not pid_running(pid)
        )

    def _write(self, rank: int, kind: str, text: str) -> None:
        # Write-then-rename: the parent polls this directory and must never read half a traceback.
        partial = self.path / f".rank{rank}.{kind}.{os.getpid()}"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, self._file(rank, kind))

    def _file(self, rank: int, kind: str) -> Path:
        return self.path / f"rank{rank}.{kind}"

    def _ranks(self, kind: str) -> set[int]:
        suffix = f".{kind}"
        return {
            int(entry.name[len("rank") : -len(suffix)])
            for entry in os.scandir(self.path)
            if entry.name.startswith("rank") and entry.name.endswith(suffix)
        }
