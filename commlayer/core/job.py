"""A job's id: names the folder of its flight-recorder dumps and of its ranks' logs.

``commlayer run`` makes one and gives it to every rank as ``$COMMLAYER_JOB_ID``; under another
launcher the launcher's own id is used (torchrun's run id, Slurm's job and step, the MPI job's
namespace), else the rendezvous' address, which is unique among the jobs running at one time.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from commlayer.core import settings

__all__ = ["JOB_ID_ENV", "TRACE_DIR_ENV", "job_id", "new_job_id", "trace_root"]

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
