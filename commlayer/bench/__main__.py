"""``python -m commlayer.bench ...`` is ``commlayer bench ...``."""

from __future__ import annotations

from commlayer.bench.cli import standalone

raise SystemExit(standalone())
