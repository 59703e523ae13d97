"""Running the examples the way users do, as whole scripts under a real launcher.

Every example states how it runs in its module docstring, one command per line starting
``Run:`` (examples/allreduce.py: ``Run: COMMLAYER_BACKEND=gloo commlayer run -n 2
examples/allreduce.py``). :func:`run_lines` reads them and :func:`command_of` turns one into what
this checkout runs: ``commlayer``, ``python`` and ``torchrun`` are this interpreter's, ``mpirun -n
N`` is the launcher that matches mpi4py's MPI (:func:`commlayer.testing.mpi.mpirun_plan`), and a
``MASTER_PORT`` the line fixes is swapped for a free one, so parallel runs never collide.
"""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from commlayer.core.ports import free_port

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
RUN_PREFIX = "Run:"


def example_files() -> list[Path]:
    """Every example script: the .py files of examples/, outside installable packages (plugin/)."""
    packages = {path.parent for path in EXAMPLES.rglob("pyproject.toml")}
    return sorted(
        path
        for path in EXAMPLES.rglob("*.py")
        if not any(package in path.parents for package in packages) and "__pycache__" not in path.parts
    )


def run_lines(path: Path) -> list[str]:
    """The commands of ``path``'s ``Run:`` lines, in order."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    lines = (line.strip() for line in docstring.splitlines())
    return [line[len(RUN_PREFIX) :].strip() for line in lines if line.startswith(RUN_PREFIX)]


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]
    needs: str | None  # "mpi" or "ccl" where the line needs them


def command_of(line: str) -> Command:
    """What runs ``line`` here (see the module docstring)."""
    words = shlex.split(line)
    env = dict(os.environ)
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = str(free_port()) if name == "MASTER_PORT" else value
    program, arguments = words[0], words[1:]
    needs = "ccl" if env.get("COMMLAYER_BACKEND") == "ccl" else None
    if program == "commlayer":
        return Command([sys.executable, "-m", "commlayer", *arguments], env, needs)
    if program == "python":
        return Command([sys.executable, *arguments], env, needs)
    if program == "torchrun":
        return Command([str(Path(sys.executable).with_name("torchrun")), *arguments], env, needs)
    if program == "mpirun" and arguments[:1] == ["-n"]:
        from commlayer.testing.mpi import mpirun_plan

        plan = mpirun_plan(int(arguments[1]), env)
        rest = [sys.executable if word == "python" else word for word in arguments[2:]]
        return Command([*plan.argv, *rest], dict(plan.env), "mpi")
    raise ValueError(f"Run: line {line!r}: expected commlayer, python, torchrun or mpirun -n N")


def run_line(line: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """Run one ``Run:`` line from the repository's root, as a user would."""
    command = command_of(line)
    return subprocess.run(
        command.argv,
        cwd=REPO,
        env=command.env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


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
