"""Which dumps to read: one job's ``rank<N>.json`` files, never two jobs' mixed.

Every job dumps into its own folder under ``$COMMLAYER_TRACE_DIR`` (see
:mod:`commlayer.core.job`). Given that parent folder (or nothing: the configured one), the
newest job's folder is read; a folder whose dumps name different jobs is refused, since lining
up two jobs' collectives reports mismatches that never happened.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from commlayer.core.errors import describe_ranks

__all__ = ["DUMP_NAME", "find_job_folder", "load_dumps"]

DUMP_NAME = re.compile(r"rank(\d+)\.json")


def find_job_folder(directory: str | Path) -> Path:
    """``directory`` if it holds dumps, else its newest subfolder that does (a job's folder)."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ValueError(f"trace analyze: argument 'DIR' expected a directory of dumps, received '{folder}'")
    if _dump_files(folder):
        return folder
    jobs = [child for child in folder.iterdir() if child.is_dir() and _dump_files(child)]
    if not jobs:
        raise ValueError(f"trace analyze: no rank<N>.json dumps in '{folder}' or in a job folder inside it")
    return max(jobs, key=_newest_dump_time)


def load_dumps(directory: str | Path) -> dict[int, dict[str, Any]]:
    """Every ``rank<N>.json`` of one job in ``directory``, by rank.

    ValueError names an unreadable file, or the jobs when the folder mixes several."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ValueError(f"trace analyze: argument 'DIR' expected a directory of dumps, received '{folder}'")
    dumps: dict[int, dict[str, Any]] = {}
    for path, rank in _dump_files(folder):
        try:
            dumps[rank] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"trace analyze: cannot read the dump '{path}': {error}") from error
    if not dumps:
        raise ValueError(f"trace analyze: no rank<N>.json dumps in '{folder}'")
    _refuse_mixed_jobs(folder, dumps)
    return dumps


def _dump_files(folder: Path) -> list[tuple[Path, int]]:
    found = []
    for path in sorted(folder.iterdir()):
        match = DUMP_NAME.fullmatch(path.name)
        if match is not None and path.is_file():
            found.append((path, int(match.group(1))))
    return found


def _newest_dump_time(folder: Path) -> float:
    return max(path.stat().st_mtime for path, _ in _dump_files(folder))


def _refuse_mixed_jobs(folder: Path, dumps: dict[int, dict[str, Any]]) -> None:
    """Dumps name their job (and world size); a folder holding more than one is not analysed."""
    jobs: dict[str, list[int]] = {}
    for rank, dump in sorted(dumps.items()):
        key = f"job '{dump['job']}'" if "job" in dump else f"a world of {dump.get('world_size', '?')}"
        jobs.setdefault(key, []).append(rank)
    if len(jobs) > 1 or len({dump.get("world_size") for dump in dumps.values()}) > 1:
        listing = "; ".join(f"{job}: {describe_ranks(ranks)}" for job, ranks in jobs.items())
        raise ValueError(
            f"trace analyze: '{folder}' holds the dumps of more than one job ({listing}); lining them "
            "up would report mismatches that never happened. Analyze one job's folder (each job "
            "dumps into $COMMLAYER_TRACE_DIR/<job id>), or remove the other job's files"
        )
