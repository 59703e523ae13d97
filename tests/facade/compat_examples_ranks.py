"""Rank bodies that run the examples inside the harness (tracebacks and timeouts included)."""

from __future__ import annotations

import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def ddp() -> None:
    runpy.run_path(str(EXAMPLES / "ddp_train.py"), run_name="__main__")
