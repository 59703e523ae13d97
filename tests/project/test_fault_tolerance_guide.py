"""The fault-tolerance guide shows its example script itself, never a copy that could drift.

The Python blocks of its fault-tolerant training section are pymdownx.snippets includes of files
under examples/ (mkdocs.yml resolves them from the repository root), and the example states how
it runs.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "fault-tolerance.md"
EXAMPLE = "examples/fault_tolerant_training.py"
_INCLUDE = re.compile(r'--8<-- "(?P<path>[^"]+)"')


def _python_blocks(text: str) -> list[str]:
    return [
        block.strip() for block in re.findall(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    ]


def test_the_guides_training_block_is_the_example_file_included_verbatim() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    blocks = _python_blocks(text[text.index("## Fault-tolerant training") :])
    includes = [match["path"] if (match := _INCLUDE.fullmatch(block)) else block for block in blocks]
    assert includes == [EXAMPLE], blocks
    assert (REPO / EXAMPLE).is_file()
    snippets = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    assert "pymdownx.snippets" in snippets and "base_path: [.]" in snippets


def test_the_example_says_how_it_runs() -> None:
    text = (REPO / EXAMPLE).read_text(encoding="utf-8")
    assert "\nRun: commlayer run --ft -n 4 examples/fault_tolerant_training.py\n" in text
