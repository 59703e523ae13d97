"""Optional parts fail with a hint that names the extra to install, and no ``--help`` needs one.

Each check runs in a child process whose import system refuses the extra's modules, as if the
extra were not installed (tests/tools/blocked_imports.py).
"""

from __future__ import annotations

import pytest

from .blocked_imports import run_without

EXTRAS_MODULES = ("tqdm", "matplotlib", "pydantic", "mpi4py")


def test_zero_without_pydantic_names_the_extra() -> None:
    done = run_without(["pydantic"], "import commlayer.zero")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "ModuleNotFoundError: commlayer.zero needs pydantic, which is not installed: pip install 'commlayer[zero]'"
    ), done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["bench", "--help"],
        ["trace", "analyze", "--help"],
        ["test-backend", "--help"],
    ],
)
def test_help_needs_no_extra(argv: list[str]) -> None:
    done = run_without(EXTRAS_MODULES, f"from commlayer.cli import main; raise SystemExit(main({argv!r}))")
    assert done.returncode == 0, done.stderr
    assert "usage: commlayer" in done.stdout


def test_bench_help_without_tqdm_shows_the_machine_defaults() -> None:
    done = run_without(
        ["tqdm"], "from commlayer.cli import main; raise SystemExit(main(['bench', '--help']))"
    )
    assert done.returncode == 0, done.stderr
    shown = " ".join(done.stdout.split())
    assert "largest message S (default 32M)" in shown
    assert "(default: this host's default backend" in shown


def test_a_plot_without_matplotlib_names_the_extra() -> None:
    code = "from commlayer.cli import main; raise SystemExit(main(['bench', '--plot', 'x.png']))"
    done = run_without(["matplotlib"], code)
    assert done.returncode == 2
    assert "--plot needs matplotlib: pip install 'commlayer[bench]'" in done.stderr


def test_the_mpi_backend_without_mpi4py_names_the_extra() -> None:
    code = "from commlayer.cli import main; raise SystemExit(main(['backends']))"
    done = run_without(["mpi4py"], code)
    assert done.returncode == 0, done.stderr
    mpi = next(line for line in done.stdout.splitlines() if line.startswith("mpi "))
    assert "unavailable" in mpi and "commlayer[mpi]" in mpi, done.stdout
