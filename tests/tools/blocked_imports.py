"""Run Python code in a child process where some modules cannot be imported, as if the optional
parts of commlayer that bring them were not installed (a sys.meta_path blocker)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_BLOCKER = """
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""


def run_without(blocked: Sequence[str], code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -c code`` with the top-level modules ``blocked`` unimportable."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    program = _BLOCKER.format(blocked=set(blocked)) + code
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
