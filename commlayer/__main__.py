"""``python -m commlayer ...`` is the ``commlayer`` console script."""

from __future__ import annotations

from commlayer.cli import main

raise SystemExit(main())
