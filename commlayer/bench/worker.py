"""What each rank started by ``commlayer bench -n N`` runs: the sweep, then rank 0's result file.

The parent passes the options as JSON in ``$COMMLAYER_BENCH_OPTIONS`` and names the files for
rank 0's result and progress in ``$COMMLAYER_BENCH_RESULT`` / ``$COMMLAYER_BENCH_PROGRESS``.
"""

from __future__ import annotations

import json
from pathlib import Path

from commlayer.bench.options import BenchOptions
from commlayer.bench.progress import StepFileWriter
from commlayer.bench.runner import run_sweep
from commlayer.core import settings

__all__ = ["main"]


def main() -> int:
    options = BenchOptions.from_json(settings.BENCH_OPTIONS.required())
    progress = settings.BENCH_PROGRESS.text()
    writer = StepFileWriter(progress) if progress else None
    result = run_sweep(options, writer, writer.row if writer is not None else None)
    if result is not None:
        target = Path(settings.BENCH_RESULT.required())
        staging = target.with_suffix(".partial")
        staging.write_text(json.dumps(result.to_json()), encoding="utf-8")
        staging.replace(target)  # the parent never reads a half-written file
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
