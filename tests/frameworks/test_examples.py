"""Every example of the integrations guide (examples/frameworks/) runs by its ``Run:`` lines and
trains on commlayer's process group."""

from __future__ import annotations

import ast
import shlex
import sys
from pathlib import Path

import pytest

from tests.frameworks.launchers import BIN, REPO, run_script

pytestmark = [pytest.mark.frameworks, pytest.mark.multirank]

EXAMPLES = sorted((REPO / "examples" / "frameworks").glob("*.py"))
NEEDS = {
    "accelerate_train.py": "accelerate",
    "deepspeed_train.py": "deepspeed",
    "lightning_train.py": "lightning",
    "ray_train.py": "ray.train",
    "trainer_train.py": "transformers",
}


def run_lines(path: Path) -> list[list[str]]:
    """The commands of the docstring's ``Run:`` lines, their programs resolved in this venv."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    commands = [
        shlex.split(line[len("Run:") :]) for line in docstring.splitlines() if line.startswith("Run:")
    ]
    programs = {"python": sys.executable, "commlayer": str(BIN / "commlayer")}
    return [[programs.get(command[0], command[0]), *command[1:]] for command in commands]


def test_every_example_is_known() -> None:
    assert sorted(path.name for path in EXAMPLES) == sorted(NEEDS)
    assert all(run_lines(path) for path in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.stem)
def test_example_trains_on_commlayer(path: Path) -> None:
    pytest.importorskip(NEEDS[path.name])
    for command in run_lines(path):
        assert "process group: commlayer" in run_script(command), command
