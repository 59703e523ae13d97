"""Pure logic: the flight-recorder entry is declared once, in Python, and the C side agrees.

commlayer/core/flight_recorder.py declares an entry's fields (ENTRY_FIELDS), the Recording every
fast path records by, and the entry states; csrc/common/recorder_spec.h is generated from them
(``python -m commlayer.core.flight_recorder``) and every C fast path reads the entry's layout and
the Recording's fields from it. A field changed in Python and not regenerated fails here; a field
added that C does not fill fails the C build (recorder.h's static assert).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.core import flight_recorder
from commlayer.core.flight_recorder import C_SPEC, ENTRY_FIELDS, Recording, c_spec


def test_the_generated_c_header_matches_the_python_declarations() -> None:
    assert C_SPEC.read_text() == c_spec(), "run: python -m commlayer.core.flight_recorder"


def test_the_slot_constants_follow_the_declared_fields() -> None:
    constants = [getattr(flight_recorder, field.upper()) for field in ENTRY_FIELDS]
    assert constants == list(range(len(ENTRY_FIELDS)))


@pytest.mark.parametrize("change", ["rename an entry field", "add a recording field"])
def test_a_python_change_without_c_fails_the_check(change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if change == "rename an entry field":
        monkeypatch.setattr(flight_recorder, "ENTRY_FIELDS", ("sequence", *ENTRY_FIELDS[1:]))
    else:
        monkeypatch.setattr(Recording, "_fields", (*Recording._fields, "group"))
    assert C_SPEC.read_text() != c_spec()


def test_every_c_fast_path_reads_the_recording_through_the_generated_spec() -> None:
    """No C file spells a slot or a Recording field by position or by its own name."""
    root = C_SPEC.parents[1]
    users = {
        path.relative_to(root).as_posix() for path in root.rglob("*") if "RECORDER_ENTRY_" in _text(path)
    }
    assert users == {"common/recorder.h", "common/recorder_spec.h"}
    for path in root.rglob("*.c*"):
        text = _text(path)
        assert "kFields" not in text and "ENTRY_SLOTS" not in text.replace("RECORDER_ENTRY_SLOTS", ""), path


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""
