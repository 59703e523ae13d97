"""Every backend reaches the flight recorder's fast-path factories by names that exist.

A backend's ``recorded_plan`` only runs where its device does (peermem needs GPUs), so a renamed
``Recording`` method would otherwise first fail on the GPU machine.
"""

from __future__ import annotations

import ast
from pathlib import Path

from commlayer.core.flight_recorder import Recording

ROOT = Path(__file__).resolve().parents[2]


def _recording_attributes(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "recording"
    }


def test_backends_call_only_methods_the_recording_has() -> None:
    missing = {
        f"{path.relative_to(ROOT)}: recording.{name}"
        for folder in ("backends", "commlayer")
        for path in (ROOT / folder).rglob("*.py")
        for name in _recording_attributes(path)
        if not hasattr(Recording, name)
    }
    assert not missing, sorted(missing)
