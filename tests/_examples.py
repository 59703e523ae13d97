"""Running the examples the way users do, as whole scripts under a real launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def torchrun_allreduce_example(backend: str, nproc: int = 2) -> subprocess.CompletedProcess[str]:
    """``torchrun --standalone`` on examples/allreduce.py with ``COMMLAYER_BACKEND=backend``.

    ``backend=""`` leaves the choice to commlayer, as an unset variable would.
    """
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun),
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(REPO / "examples" / "allreduce.py"),
    ]
    env = {**os.environ, "COMMLAYER_BACKEND": backend}
    return subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, check=False)
