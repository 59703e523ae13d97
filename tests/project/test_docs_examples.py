"""The guides' code is code that runs: every program a guide shows is an included example file.

The rule for a fenced ``python`` block in docs/guides:

- it is an include, its only line ``--8<-- "examples/<file>.py"`` (pymdownx.snippets puts the file
  there verbatim), of an example that says how it runs (tests/project/test_examples.py runs it),
  between ``<!-- fmt: off -->`` and ``<!-- fmt: on -->`` (ruff formats a page's python blocks and
  would read the include line as Python: ``--8 < --"examples/x.py"``); or
- it is a fragment read in place: it never calls ``init_process_group`` (whatever sets up a world
  is a program a reader would run) and has at most ``FRAGMENT_LINES`` non-blank lines, unless it
  is a listing of signatures (every function in it has ``...`` for a body, and it calls nothing
  at its top level).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests._examples import REPO, run_lines

GUIDES = REPO / "docs" / "guides"
FRAGMENT_LINES = 5
_INCLUDE = re.compile(r'^--8<-- "(examples/[\w/.-]+\.py)"$')


def python_blocks(page: Path) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of every fenced ``python`` block of ``page``."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if current is None and line.strip() == "```python":
            current, start = [], number + 1
        elif current is not None and line.strip() == "```":
            blocks.append((start, current))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def signature_listing(source: str) -> bool:
    """Whether ``source`` only declares: functions with ``...`` bodies, and no top-level call."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    stubs = all(
        len(function.body) == 1
        and isinstance(function.body[0], ast.Expr)
        and isinstance(function.body[0].value, ast.Constant)
        and function.body[0].value.value is Ellipsis
        for function in functions
    )
    calls = any(isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) for node in tree.body)
    return bool(functions) and stubs and not calls


def verdict(lines: list[str]) -> str | None:
    """Why a block breaks the rule (see the module docstring), or None."""
    code = [line for line in lines if line.strip()]
    if len(code) == 1 and _INCLUDE.match(code[0].strip()):
        included = REPO / _INCLUDE.match(code[0].strip()).group(1)
        if not included.is_file():
            return f"includes {included.relative_to(REPO)}, which does not exist"
        return (
            None if run_lines(included) else f"includes {included.relative_to(REPO)}, which has no Run: line"
        )
    if any(line.lstrip().startswith("--8") for line in code):
        return 'an include is the block\'s only line, exactly --8<-- "examples/<file>.py"'
    source = "\n".join(lines)
    if "init_process_group" in source:
        return "sets up a world (init_process_group): make it an example file and include it"
    if len(code) > FRAGMENT_LINES and not signature_listing(source):
        return f"{len(code)} lines of code: make it an example file and include it"
    return None


BLOCKS = [
    pytest.param(lines, id=f"{page.relative_to(REPO)}:{start}")
    for page in sorted(GUIDES.rglob("*.md"))
    for start, lines in python_blocks(page)
]


@pytest.mark.parametrize("lines", BLOCKS)
def test_a_guides_python_block_is_an_included_example_or_a_fragment(lines: list[str]) -> None:
    assert verdict(lines) is None, verdict(lines)


def test_the_rule_tells_programs_from_fragments() -> None:
    assert verdict(['--8<-- "examples/allreduce.py"']) is None
    assert "exactly" in verdict(['--8 < --"examples/allreduce.py"'])  # as a Python formatter leaves it
    assert "does not exist" in verdict(['--8<-- "examples/nothing.py"'])
    assert verdict(["dist.all_reduce(grads)", "dist.barrier()"]) is None
    assert "init_process_group" in verdict(["from commlayer import dist", "dist.init_process_group()"])
    assert "6 lines" in verdict(["x = 1"] * 6)
    listing = [
        "class B(Backend):",
        "    name = 'mine'",
        "",
        *[f"    def op{i}(self) -> None: ..." for i in range(6)],
    ]
    assert verdict(listing) is None
    assert "lines of code" in verdict([*listing, "B().op0()"])
