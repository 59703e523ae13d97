"""Every example runs as its docstring says: each ``Run:`` line, at its ranks, on its backends.

The examples are what the guides show (tests/project/test_docs_examples.py holds the guides to
them), so this is the guides' code running. Each line runs from the repository's root exactly as
written, with this checkout's interpreter and launchers (tests/_examples.py); a line that needs
MPI or oneCCL is skipped where they are missing, and so is an example whose top-level imports are
not installed (the framework examples; .ci/setup-frameworks installs them). A new example is
picked up by its ``Run:`` lines.
"""

from __future__ import annotations

import ast
import importlib.util
import shlex
from pathlib import Path

import pytest

from commlayer.contract.registry import list_backends
from commlayer.testing.mpi import mpirun_unavailable_reason
from tests._examples import REPO, command_of, example_files, run_line, run_lines

CASES = [
    pytest.param(line, id=f"{path.relative_to(REPO)}:{index}")
    for path in example_files()
    for index, line in enumerate(run_lines(path))
]


def _missing_modules(line: str) -> list[str]:
    """The top-level modules the line's example imports that are not installed here (a framework
    example's DeepSpeed, Lightning, ...): its Run: line is then skipped, not failed."""
    scripts = [
        REPO / word for word in shlex.split(line) if word.startswith("examples/") and word.endswith(".py")
    ]
    missing = []
    for script in scripts:
        for node in ast.parse(Path(script).read_text(encoding="utf-8")).body:
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            missing += [name for name in names if importlib.util.find_spec(name.split(".")[0]) is None]
    return missing


def _missing(needs: str | None) -> str | None:
    if needs == "mpi":
        return mpirun_unavailable_reason()
    if needs == "ccl":
        ccl = {info.name: info.availability for info in list_backends()}.get("ccl")
        return None if ccl else f"ccl cannot run here: {getattr(ccl, 'reason', 'not installed')}"
    return None


@pytest.mark.slow
@pytest.mark.examples
@pytest.mark.parametrize("line", CASES)
def test_example_runs_as_its_docstring_says(line: str) -> None:
    missing = _missing(command_of(line).needs)
    if missing:
        pytest.skip(missing)
    modules = _missing_modules(line)
    if modules:
        pytest.skip(f"the example imports what is not installed here: {', '.join(sorted(set(modules)))}")
    result = run_line(line)
    assert result.returncode == 0, (
        f"{line}\n--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-6000:]}"
    )


def test_every_example_says_how_it_runs() -> None:
    silent = [str(path.relative_to(REPO)) for path in example_files() if not run_lines(path)]
    assert not silent, f"examples without a 'Run:' line in their docstring: {silent}"
    for path in example_files():
        for line in run_lines(path):
            assert str(path.relative_to(REPO)) in line, (path, line)
            command_of(line)  # parses, and names a launcher the tests know
