"""Where and how a ``commlayer bench`` run was made: the header of its JSON file.

::

    {"host": "node1", "cpu": "AMD EPYC (2 cores)", "gpus": [], "python": "3.11.7",
     "torch": "2.13.0+cpu", "commlayer": "0.1.0", "mpi": "Open MPI v4.1.4, ...", "oneccl": "2021.14.1",
     "date": "2026-11-27T06:50:00+00:00", "command": "commlayer bench -n 2 --json out.json"}

Libraries that are not installed are left out rather than imported to ask.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

__all__ = ["run_metadata"]


def run_metadata(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The metadata of this run; ``argv`` defaults to this process's command line."""
    import torch  # already imported by the benchmark itself

    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "cpu": _cpu_name(),
        "gpus": [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "commlayer": _version("commlayer"),
    }
    info.update(
        {name: found for name, found in (("mpi", _mpi_version()), ("oneccl", _oneccl_version())) if found}
    )
    info["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    info["command"] = shlex.join(["commlayer", *(sys.argv[1:] if argv is None else argv)])
    return info


def _cpu_name() -> str:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name} ({os.cpu_count()} cores)"


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _mpi_version() -> str | None:
    """The MPI library's own version line (mpi4py's MPI.Get_library_version()), asked in a child
    process when this one has not loaded MPI: importing it here would initialise MPI."""
    loaded = sys.modules.get("mpi4py.MPI")
    if loaded is not None:
        return str(loaded.Get_library_version()).splitlines()[0].strip()
    if _version("mpi4py") is None:
        return None
    ask = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"
    try:
        shown = subprocess.run(
            [sys.executable, "-c", ask], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = shown.stdout.strip().splitlines()
    return lines[0].strip() if shown.returncode == 0 and lines else None


def _oneccl_version() -> str | None:
    return _version("oneccl-cpu") or _version("oneccl-devel") or _version("oneccl")
