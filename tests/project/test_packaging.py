"""What a user installs: the extras, the license, the version, and no build outputs in git.

Pure logic on pyproject.toml and the checkout; the install itself (a fresh venv with only
``pip install '<checkout>[all]'``, every backend's demo on 4 ranks) is .ci/packaging.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib

from commlayer.cli import main

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
USER_EXTRAS = ("mpi", "ccl", "bench", "zero")


def test_all_is_the_union_of_every_user_extra() -> None:
    extras = PROJECT["optional-dependencies"]
    union = {requirement for name in USER_EXTRAS for requirement in extras[name]}
    assert set(extras["all"]) == union
    assert len(extras["all"]) == len(union)  # each requirement once


def test_ccl_extra_brings_what_the_first_use_build_needs() -> None:
    names = {
        requirement.split(">")[0].split("=")[0] for requirement in PROJECT["optional-dependencies"]["ccl"]
    }
    assert names == {"oneccl-cpu", "oneccl-cpu-devel", "pybind11"}


def test_license_file_is_the_apache_2_license_pyproject_names() -> None:
    text = (REPO / "LICENSE").read_text()
    assert PROJECT["license"] == {"text": "Apache-2.0"}
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) == 202


def test_version_comes_from_the_installed_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"commlayer {metadata.version('commlayer')}\n"
    shown = subprocess.run(
        [sys.executable, "-m", "commlayer", "--version"], capture_output=True, text=True, check=True
    )
    assert shown.stdout == f"commlayer {PROJECT['version']}\n"


def test_every_source_folder_is_a_package_setuptools_finds() -> None:
    # A folder without __init__.py imports in a checkout but is left out of a wheel.
    folders = [
        path.parent
        for root in ("commlayer", "backends")
        for path in (REPO / root).rglob("*.py")
        if "__pycache__" not in path.parts and "_csrc" not in path.parts
    ]
    assert sorted({str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").exists()}) == []


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_no_build_outputs_are_tracked_and_objects_are_ignored() -> None:
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert [name for name in tracked if name.endswith((".o", ".so", ".a"))] == []
    built = ["csrc/ccl/binding.o", "backends/shm/_C.so", "build/libx.a"]
    ignored = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", *built], capture_output=True, text=True, check=False
    )
    assert ignored.stdout.split() == built
