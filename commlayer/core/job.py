"""A job's id: names the folder of its flight-recorder dumps and of its ranks' logs.

``commlayer run`` makes one and gives it to every rank as ``$COMMLAYER_JOB_ID``; under another
launcher the launcher's own id is used (torchrun's run id, Slurm's job and step, the MPI job's
namespace), else the rendezvous' address, else a fresh one. Ranks need not see the same
variables (Intel MPI gives them none in common): at init, rank 0's id is shared through the
rendezvous store (:func:`agree_job_id`), and every rank of the job then names the same folder.

Job folders pile up: :func:`prune_job_folders` keeps the newest ``$COMMLAYER_KEEP_JOBS``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from commlayer.core import settings

__all__ = [
    "JOB_ID_ENV",
    "TRACE_DIR_ENV",
    "agree_job_id",
    "current_job_id",
    "job_id",
    "keep_jobs",
    "new_job_id",
    "prune_job_folders",
    "trace_root",
]

JOB_ID_ENV = settings.JOB_ID.name
TRACE_DIR_ENV = settings.TRACE_DIR.name
# Each launcher's id of the job, in the order they are asked.
_LAUNCHER_IDS = (
    ("TORCHELASTIC_RUN_ID", "torchrun-{}"),
    ("SLURM_JOB_ID", "slurm-{}"),
    ("PMIX_NAMESPACE", "{}"),
    ("OMPI_MCA_ess_base_jobid", "ompi-{}"),
    ("PMI_ID_NAMESPACE", "{}"),
)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
# The store key of rank 0's id, one per start of the job (torchrun's agent store outlives restarts).
_AGREED_KEY = "commlayer/job_id/{}"
_agreed: str | None = None
ACTIVE_S = 600.0  # a job folder written this recently belongs to a job that may still run


def trace_root(environ: Mapping[str, str]) -> Path:
    """The folder holding one dump folder per job: ``$COMMLAYER_TRACE_DIR``, else ``<tmp>/commlayer-trace``."""
    configured = settings.TRACE_DIR.text(environ)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "commlayer-trace"


def new_job_id() -> str:
    """``20261127-065012-4242``: the start time, then this process's pid."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def job_id(environ: Mapping[str, str]) -> str:
    """The id of the job this process belongs to, safe as a folder name."""
    found = settings.JOB_ID.text(environ)
    for variable, spelling in _LAUNCHER_IDS:
        if found:
            break
        if environ.get(variable) and not (variable == "TORCHELASTIC_RUN_ID" and environ[variable] == "none"):
            found = spelling.format(environ[variable])
            if variable == "SLURM_JOB_ID" and environ.get("SLURM_STEP_ID"):
                found += f".{environ['SLURM_STEP_ID']}"
    if not found and environ.get("MASTER_PORT"):
        found = f"{environ.get('MASTER_ADDR', 'localhost')}-{environ['MASTER_PORT']}"
    return _UNSAFE.sub("_", found) if found else f"pid-{os.getpid()}"


def agree_job_id(store: Any, rank: int, environ: Mapping[str, str] = os.environ) -> str:
    """Rank 0's job id, shared through the rendezvous ``store``; every rank then dumps into its folder.

    Rank 0 publishes its :func:`job_id` (a fresh :func:`new_job_id` when no launcher named the
    job); the others read it (waiting, bounded by the store's timeout). It is remembered for
    :func:`current_job_id` until the next agreement.
    """
    global _agreed
    key = _AGREED_KEY.format(environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == 0:
        agreed = job_id(environ)
        if agreed == f"pid-{os.getpid()}":
            agreed = new_job_id()
        store.set(key, agreed)
    else:
        agreed = _UNSAFE.sub("_", store.get(key).decode(errors="replace"))
    _agreed = agreed
    return agreed


def current_job_id(environ: Mapping[str, str] = os.environ) -> str:
    """The id agreed at init (:func:`agree_job_id`), else this process's own :func:`job_id`."""
    return _agreed or job_id(environ)


def prune_job_folders(
    root: Path, keep: int, is_job_folder: Callable[[Path], bool], spare: Path | None = None
) -> list[Path]:
    """Remove all but the ``keep`` newest job folders under ``root``; return the removed ones.

    Only folders that ``is_job_folder`` recognises are counted or removed (``root`` may be a
    folder the user shares with other files); ``spare`` (this job's own) and any folder written
    in the last :data:`ACTIVE_S` seconds (a job still running) are kept. ``keep`` < 1 keeps every
    folder. Folders that vanish meanwhile (another rank pruning) are skipped.
    """
    if keep < 1 or not root.is_dir():
        return []
    folders = []
    for child in root.iterdir():
        try:
            if child != spare and child.is_dir() and not child.is_symlink() and is_job_folder(child):
                folders.append((_last_write(child), child))
        except OSError:
            continue
    folders.sort(reverse=True)
    recent = time.time() - ACTIVE_S
    old = folders[max(keep - (spare is not None), 0) :]
    removed = [folder for written, folder in old if written < recent]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def _last_write(folder: Path) -> float:
    """When ``folder`` or a file in it was last written (a log file grows without touching its folder)."""
    return max([folder.stat().st_mtime, *(child.stat().st_mtime for child in folder.iterdir())])


def keep_jobs(environ: Mapping[str, str] = os.environ) -> int:
    """How many job folders to keep: ``$COMMLAYER_KEEP_JOBS`` (0 keeps all)."""
    return int(settings.KEEP_JOBS.value(environ))
