"""Structure: names that say what they are.

"launch" means starting processes only (``commlayer run``, the test harness, the bench's own
starter): no other module, folder, class or C extension is named after it; the per-op native
paths are "fast paths". No file name containing "plan" appears twice (one module holds plans).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("commlayer", "backends", "csrc")
# Where "launch" means starting processes: commlayer run, the test harness's worlds, the CLIs.
STARTS_PROCESSES = (
    "commlayer/launch/",
    "commlayer/cli.py",
    "commlayer/bench/cli.py",
    "commlayer/testing/harness.py",
    "commlayer/testing/cluster_worlds.py",
)
# A CUDA kernel launch is the CUDA term (csrc/peermem and its loader).
CUDA_KERNELS = ("csrc/peermem/", "backends/peermem/")
_LAUNCH = re.compile(r"launch", re.IGNORECASE)
_C_TYPE = re.compile(r"\b(?:struct|class|enum(?:\s+class)?|typedef\s+struct)\s+(\w+)|\}\s*(\w+)\s*;")


def _files() -> list[Path]:
    """The sources (no bytecode, no built extension)."""
    return sorted(
        path
        for folder in FOLDERS
        for path in (REPO / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".so", ".pyc", ".o")
    )


def _relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _exempt(relative: str, prefixes: tuple[str, ...]) -> bool:
    return any(relative == prefix or relative.startswith(prefix) for prefix in prefixes)


def test_no_file_or_folder_outside_process_starting_is_named_launch() -> None:
    named = sorted(
        relative
        for path in _files()
        if _LAUNCH.search(relative := _relative(path)) and not _exempt(relative, STARTS_PROCESSES)
    )
    assert named == []


def test_no_class_outside_process_starting_is_named_launch() -> None:
    named = []
    for path in _files():
        relative = _relative(path)
        if _exempt(relative, STARTS_PROCESSES + CUDA_KERNELS):
            continue
        if path.suffix == ".py":
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
        elif path.suffix in (".c", ".h", ".cpp", ".hpp", ".inc", ".cu"):
            names = [
                name for pair in _C_TYPE.findall(path.read_text(errors="replace")) for name in pair if name
            ]
        else:
            continue
        named += [f"{relative}: {name}" for name in names if _LAUNCH.search(name)]
    assert named == []


def test_the_c_extensions_are_not_named_launch() -> None:
    declared = re.findall(r'"(commlayer(?:\.\w+)*\._\w+)"', (REPO / "setup.py").read_text(encoding="utf-8"))
    assert declared and [name for name in declared if _LAUNCH.search(name)] == []


def test_no_file_name_with_plan_appears_twice() -> None:
    names = Counter(path.name for path in _files() if "plan" in path.name.lower())
    assert [name for name, count in names.items() if count > 1] == []
    assert len(names) <= 1, sorted(names)
