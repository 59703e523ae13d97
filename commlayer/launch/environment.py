"""What ``commlayer run --hostfile`` exports to the ranks on every host.

Remote shells start with a bare environment, so the runner sends: every variable of its own
environment whose name starts with one of :data:`EXPORTED_PREFIXES` (the settings of commlayer and
of the transports below it), then the ``KEY=VALUE`` lines of a ``.commlayer_env`` file (looked for
in the current directory, then in the home directory), which win. Example ``.commlayer_env``::

    # blank lines and comments are skipped
    NCCL_IB_DISABLE=1
    HF_HOME=/shared/cache
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ENV_FILE_NAME", "EXPORTED_PREFIXES", "exported_environment", "find_env_file", "parse_env_file"]

ENV_FILE_NAME = ".commlayer_env"
EXPORTED_PREFIXES = (
    "COMMLAYER_",
    "NCCL_",
    "CCL_",
    "FI_",
    "I_MPI_",
    "OMPI_",
    "PYTHON",
    "CUDA_",
    "GLOO_",
    "MPI4PY_",
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def exported_environment(environ: Mapping[str, str], env_file: Path | None) -> dict[str, str]:
    """The prefixed variables of ``environ`` updated by ``env_file``'s lines (when given)."""
    exported = {name: value for name, value in environ.items() if name.startswith(EXPORTED_PREFIXES)}
    if env_file is not None:
        exported.update(parse_env_file(env_file.read_text(encoding="utf-8"), str(env_file)))
    return exported


def find_env_file(cwd: Path | None = None, home: Path | None = None) -> Path | None:
    """``./.commlayer_env`` if it exists, else ``~/.commlayer_env``, else None."""
    for folder in (cwd or Path.cwd(), home or Path(os.path.expanduser("~"))):
        candidate = folder / ENV_FILE_NAME
        if candidate.is_file():
            return candidate
    return None


def parse_env_file(text: str, source: str = ENV_FILE_NAME) -> dict[str, str]:
    """``"A=1\\n# c\\nB = two words"`` -> ``{"A": "1", "B": "two words"}``."""
    variables: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, equals, value = line.partition("=")
        if not equals or _NAME.fullmatch(name.strip()) is None:
            raise ValueError(f"{source}:{number}: expected 'NAME=VALUE', received {raw.strip()!r}")
        variables[name.strip()] = value.strip()
    return variables
