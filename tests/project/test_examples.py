"""Every example runs as its docstring says: each ``Run:`` line, at its ranks, on its backends.

The examples are what the guides show (tests/project/test_docs_examples.py holds the guides to
them), so this is the guides' code running. Each line runs from the repository's root exactly as
written, with this checkout's interpreter and launchers (tests/_examples.py); a line that needs
MPI or oneCCL is skipped where they are missing. A new example is picked up by its ``Run:`` lines.
"""

from __future__ import annotations

import pytest

from commlayer.contract.registry import list_backends
from commlayer.testing.mpi import mpirun_unavailable_reason
from tests._examples import REPO, command_of, example_files, run_line, run_lines

CASES = [
    pytest.param(line, id=f"{path.relative_to(REPO)}:{index}")
    for path in example_files()
    for index, line in enumerate(run_lines(path))
]


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
