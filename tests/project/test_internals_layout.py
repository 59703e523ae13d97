"""Structure: the internals page's layout names every folder of the tree, and nothing else.

The ``## Layout`` section of docs/guides/internals.md holds one code block: a tree of entries, two
spaces of indent per level, each a path relative to its parent (``core/``, ``dist.py``) followed by
its description; lines that continue a description start further right. Every package of
commlayer/ and backends/, every folder of csrc/, tests/, benchmarks/, examples/ and docs/, and
every top-level folder must be an entry, and every entry must exist.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "guides" / "internals.md"
# Entries start before this column; description lines that continue one start at it.
_DESCRIPTION_COLUMN = 26
_SKIPPED = {"__pycache__", "build", "dist", "site"}


def _block() -> list[str]:
    section = PAGE.read_text(encoding="utf-8").split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```\n", 2)[1].splitlines()


def _entries() -> list[str]:
    """Every path the block names, relative to the repository."""
    found, parents = [], []
    for line in _block():
        indent = len(line) - len(line.lstrip(" "))
        token = line.split(maxsplit=1)[0] if line.strip() else ""
        if indent >= _DESCRIPTION_COLUMN or not re.fullmatch(r"\.?[\w.-]+(/|\.py)", token):
            continue
        level = indent // 2
        parents[level:] = [token]
        found.append("".join(parents[: level + 1]))
    return found


def _folders() -> set[str]:
    """The folders the block must name."""
    wanted = {f"{path.name}/" for path in REPO.iterdir() if path.is_dir() and path.name not in _SKIPPED}
    wanted = {name for name in wanted if not name.endswith(".egg-info/")}  # the editable install's
    wanted = {name for name in wanted if not name.startswith(".") or name == ".ci/"}
    for root, depth in (("csrc", 1), ("tests", 1), ("benchmarks", 1), ("examples", 1), ("docs", 1)):
        wanted |= {f"{path.relative_to(REPO).as_posix()}/" for path in _subfolders(REPO / root, depth)}
    for root in ("commlayer", "backends"):  # every package, at any depth
        wanted |= {
            f"{init.parent.relative_to(REPO).as_posix()}/" for init in (REPO / root).rglob("__init__.py")
        }
    return wanted


def _subfolders(root: Path, depth: int) -> list[Path]:
    found = [path for path in root.iterdir() if path.is_dir() and path.name not in _SKIPPED]
    return found + (
        [nested for path in found for nested in _subfolders(path, depth - 1)] if depth > 1 else []
    )


def test_every_folder_of_the_tree_is_in_the_layout() -> None:
    assert sorted(_folders() - set(_entries())) == []


def test_every_entry_of_the_layout_exists() -> None:
    assert [entry for entry in _entries() if not (REPO / entry).exists()] == []


def test_the_layout_lists_the_layers_in_the_layering_test_order() -> None:
    """The facade's parts appear in the order tests/project/test_layering.py layers them."""
    parts = [entry.split("/")[2] for entry in _entries() if re.fullmatch(r"commlayer/facade/\w+/", entry)]
    assert parts == ["groups", "monitor", "calls", "ops", "lifecycle", "torch_bridge"]


def test_the_parser_reads_nesting_and_skips_descriptions() -> None:
    entries = _entries()
    assert "commlayer/facade/calls/" in entries and "csrc/common/" in entries
    assert not any(" " in entry for entry in entries)
