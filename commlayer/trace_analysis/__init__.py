"""``commlayer trace analyze [DIR]`` and ``commlayer trace export --torch DIR OUT``: read the
flight-recorder dumps of one job.

``analyze`` merges every rank's dump (:mod:`.findings`) of one job (:mod:`.folders`): DIR
defaults to ``$COMMLAYER_TRACE_DIR`` (else ``<tmp>/commlayer-trace``), and a folder of job
folders means its newest job; ``--arrivals`` adds when each rank entered the collectives
(:mod:`.arrivals`: who arrives last, and by how much). ``export --torch`` writes the dumps in
torch's flight-recorder format (:mod:`.torch_format`) for torch's own analyzer, ``torchfrtrace
OUT``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from commlayer.core.job import trace_root
from commlayer.trace_analysis.arrivals import Arrivals, arrivals, describe_arrivals
from commlayer.trace_analysis.findings import GroupView, analyze, describe
from commlayer.trace_analysis.folders import find_job_folder, load_dumps
from commlayer.trace_analysis.torch_format import export_torch

__all__ = [
    "Arrivals",
    "GroupView",
    "analyze",
    "arrivals",
    "describe",
    "describe_arrivals",
    "export",
    "export_torch",
    "find_job_folder",
    "load_dumps",
    "main",
]


def main(directory: str | None = None, out: Any = None, with_arrivals: bool = False) -> int:
    """Print the analysis of one job's dumps (with ``with_arrivals``, when each rank entered the
    collectives too); 0 if they could be read, 2 otherwise."""
    stream = out or sys.stdout
    try:
        folder = find_job_folder(directory or trace_root(os.environ))
        dumps = load_dumps(folder)
        findings = analyze(dumps)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    if with_arrivals:
        findings += [describe_arrivals(found) for found in arrivals(dumps)] or [
            "arrivals: no collective that two or more dumped members of a group entered"
        ]
    print(f"dumps of job folder {folder}", file=stream)
    for line in findings:
        print(line, file=stream)
    return 0


def export(directory: str | None, target: str) -> int:
    """Write one job's dumps in torch's format into ``target``; 0 on success, 2 otherwise."""
    try:
        folder = find_job_folder(directory or trace_root(os.environ))
        written = export_torch(load_dumps(folder), Path(target))
    except (ValueError, OSError) as error:
        print(f"trace export: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print(f"read them with torch's analyzer: torchfrtrace {target}")
    return 0
