"""``commlayer bench``: nccl-tests-style collective benchmarks of every backend, side by side.

Modules: :mod:`commlayer.core.metrics` (algbw/busbw factors and sizes, shared with the comms logger),
:mod:`.options` (the run's settings), :mod:`.cases` (buffers and exact checks per op), :mod:`.runner` (the per-rank sweep),
:mod:`.records` / :mod:`.table` / :mod:`.plot` / :mod:`.progress` (outputs), :mod:`.cli` (the
command) and :mod:`.worker` (what each rank started by ``-n`` runs).
"""

from __future__ import annotations
