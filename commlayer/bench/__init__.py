"""``commlayer bench``: nccl-tests-style collective benchmarks of every backend, side by side.

Modules: :mod:`.formulas` (algbw/busbw, sizes), :mod:`.cases` (buffers and exact checks per op),
:mod:`.runner` (the per-rank sweep), :mod:`.table` / :mod:`.records` / :mod:`.plot` (outputs),
:mod:`.cli` (the command).
"""
from __future__ import annotations
