"""The settings module owns every ``COMMLAYER_*`` variable (tier 1: source text and pure logic).

Every name the product's source mentions is declared in commlayer.core.settings, no other module
spells a name out as a string of its own, the configuration page's generated tables equal the
module's, and the accessors parse each type and default.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from commlayer.core import settings
from commlayer.core.settings import GENERATED_MARKER, SETTINGS, Setting

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "guides" / "configuration.md"
NAME = re.compile(r"COMMLAYER_[A-Z0-9_]+")
C_READ = re.compile(r"getenv\(\s*\"(COMMLAYER_[A-Z0-9_]+)\"")
DECLARED = {setting.name for setting in SETTINGS}


def _python_sources() -> list[Path]:
    return sorted([*(REPO / "commlayer").rglob("*.py"), *(REPO / "backends").rglob("*.py")])


def _named_in_source() -> dict[str, set[str]]:
    """Each ``COMMLAYER_*`` name the product reads or mentions, with the files that do."""
    found: dict[str, set[str]] = {}
    for path in _python_sources():
        for name in NAME.findall(path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    for path in (REPO / "csrc").rglob("*"):
        if path.suffix in (".c", ".cc", ".cpp", ".h", ".hpp"):
            for name in C_READ.findall(path.read_text()):
                found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    for name in re.findall(r"_ENV = \"(COMMLAYER_[A-Z0-9_]+)\"", (REPO / "setup.py").read_text()):
        found.setdefault(name, set()).add("setup.py")
    return found


def test_every_variable_the_source_names_is_declared() -> None:
    undeclared = {name: sorted(files) for name, files in _named_in_source().items() if name not in DECLARED}
    assert not undeclared, f"declare these in commlayer/core/settings.py: {undeclared}"


def test_every_declared_variable_is_named_by_the_source() -> None:
    assert DECLARED <= set(_named_in_source()), DECLARED - set(_named_in_source())


def test_no_module_but_settings_spells_a_variable_name_out() -> None:
    """A name as a whole string constant outside settings.py would be a second place reading it."""
    spelled = []
    for path in _python_sources():
        if path == REPO / "commlayer" / "core" / "settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                spelled.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value}")
    assert not spelled, spelled


def test_the_page_lists_every_variable_as_the_module_generates_it() -> None:
    _, marker, generated = PAGE.read_text().partition(GENERATED_MARKER)
    assert marker, f"{PAGE} lost its line {GENERATED_MARKER!r}"
    assert generated.strip() == settings.markdown_table().strip(), (
        "regenerate it: python -m commlayer.core.settings --write docs/guides/configuration.md"
    )
    assert all(f"`{name}`" in generated for name in DECLARED)


def test_declarations_are_complete_and_consistent() -> None:
    assert len(DECLARED) == len(SETTINGS)
    for setting in SETTINGS:
        assert setting.area in settings.AREAS, setting
        assert setting.kind in (str, int, float, bool), setting
        assert setting.meaning and "\n" not in setting.meaning, setting
        assert setting.default is None or isinstance(setting.default, setting.kind), setting
        assert not setting.choices or setting.default in (None, *setting.choices), setting
        assert settings.by_name(setting.name) is setting


@pytest.mark.parametrize(
    "kind, default, raw, expected",
    [
        (bool, True, None, True),
        (bool, True, "  ", True),
        (bool, True, " OFF ", False),
        (bool, False, "yes", True),
        (bool, None, None, None),
        (int, 10, "7", 7),
        (float, 0.5, "0.25", 0.25),
        (str, "ssh", " ssh -F x ", "ssh -F x"),
        (str, None, None, None),
    ],
)
def test_value_parses_its_kind_and_falls_back_to_the_default(
    kind: type, default: object, raw: str | None, expected: object
) -> None:
    setting = Setting("COMMLAYER_EXAMPLE", kind, default, "an example", "backends")
    environ = {} if raw is None else {"COMMLAYER_EXAMPLE": raw}
    assert setting.value(environ) == expected


@pytest.mark.parametrize(
    "kind, choices, raw", [(bool, (), "maybe"), (int, (), "1.5"), (float, (), "fast"), (str, ("a", "b"), "c")]
)
def test_value_rejects_what_does_not_parse_naming_the_variable(
    kind: type, choices: tuple[str, ...], raw: str
) -> None:
    setting = Setting("COMMLAYER_EXAMPLE", kind, None, "an example", "backends", choices)
    with pytest.raises(ValueError, match=rf"\$COMMLAYER_EXAMPLE expected .*, received '{re.escape(raw)}'"):
        setting.value({"COMMLAYER_EXAMPLE": raw})


def test_choices_compare_lower_case_and_text_is_raw() -> None:
    assert settings.BRIDGE_FUTURES.value({"COMMLAYER_BRIDGE_FUTURES": "Inline"}) == "inline"
    assert settings.BRIDGE_FUTURES.value({}) == "auto"
    assert settings.MPI_MODE.text({"COMMLAYER_MPI_MODE": " Requests "}) == "Requests"
    assert settings.MPI_MODE.text({"COMMLAYER_MPI_MODE": ""}) is None


def test_value_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMLAYER_HEARTBEAT_MISSES", "4")
    assert settings.HEARTBEAT_MISSES.value() == 4
    monkeypatch.delenv("COMMLAYER_HEARTBEAT_MISSES")
    assert settings.HEARTBEAT_MISSES.value() == 10


def test_required_names_the_variable_when_it_is_missing() -> None:
    assert settings.BENCH_RESULT.required({"COMMLAYER_BENCH_RESULT": " out.json "}) == "out.json"
    with pytest.raises(KeyError, match=r"\$COMMLAYER_BENCH_RESULT must be set"):
        settings.BENCH_RESULT.required({})
