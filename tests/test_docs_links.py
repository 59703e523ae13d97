"""Documentation: every relative link and anchor in README.md and docs/ resolves (no network).

Links are read outside code blocks and code spans. A relative link must name an existing file;
from docs/ it must stay inside docs/ (the site holds nothing else). An anchor must name a heading
of its target: mkdocs' slugs for pages of the site, GitHub's for the README. Anchors into other
repository files are checked only for files listed in ``ANCHORED_ELSEWHERE``. Absolute links are
checked for form only, and a reserved ``.invalid`` host is a dead link by definition.
``mkdocs build --strict`` (.ci/run) checks the rendered site on top of this.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
#: Markdown files outside README.md and docs/ whose headings links may point into.
ANCHORED_ELSEWHERE: tuple[str, ...] = ("benchmarks/RESULTS.md", "benchmarks/README.md")
README_MAX_LINES = 200

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML_TARGET = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
_INLINE_MARKUP = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with code spans removed."""
    lines, fence = [], ""
    for line in text.splitlines():
        opening = _FENCE.match(line)
        if fence:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = ""
            continue
        if opening:
            fence = opening.group(1)
            continue
        lines.append(_CODE_SPAN.sub("", line))
    return lines


def _targets(page: Path) -> list[str]:
    found = []
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        found += _INLINE_LINK.findall(line) + _HTML_TARGET.findall(line)
        definition = _REFERENCE_DEFINITION.match(line)
        if definition:
            found.append(definition.group(1))
    return found


def _heading_texts(page: Path) -> list[str]:
    """Each heading's text as rendered: code spans keep their content, links their text."""
    texts, fence = [], ""
    for line in page.read_text(encoding="utf-8").splitlines():
        opening = _FENCE.match(line)
        if fence or opening:
            if fence and opening and opening.group(1)[0] == fence[0]:
                fence = ""
            elif not fence:
                fence = opening.group(1)
            continue
        heading = _HEADING.match(line)
        if heading:
            texts.append(_INLINE_MARKUP.sub(r"\1", heading.group(2)).replace("`", ""))
    return texts


def mkdocs_slug(text: str) -> str:
    """Python-Markdown's toc slugify, the one mkdocs uses."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())


def github_slug(text: str) -> str:
    """GitHub's heading anchors: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    slug = mkdocs_slug if DOCS in page.parents else github_slug
    anchors, seen = set(), Counter[str]()
    for text in _heading_texts(page):
        base = slug(text)
        separator = "_" if slug is mkdocs_slug else "-"
        anchors.add(base if not seen[base] else f"{base}{separator}{seen[base]}")
        seen[base] += 1
    return anchors


def _anchor_checked(target: Path) -> bool:
    if target.suffix != ".md":
        return False
    relative = target.relative_to(ROOT).as_posix()
    return target == README or DOCS in target.parents or relative in ANCHORED_ELSEWHERE


def _absolute_problem(link: str) -> str | None:
    parts = urlparse(link)
    if parts.scheme == "mailto":
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "is not a well-formed http(s) address"
    if (parts.hostname or "").endswith(".invalid"):
        return "points at a reserved .invalid host"
    return None


def _relative_problem(page: Path, link: str) -> str | None:
    path_part, _, anchor = link.partition("#")
    target = (page.parent / unquote(path_part)).resolve() if path_part else page
    if not target.exists():
        return "names a file that does not exist"
    if DOCS in page.parents and DOCS not in target.parents and target != DOCS:
        return "leaves docs/, which the site does not contain (write the path as text)"
    if target.is_dir() or not anchor or not _anchor_checked(target):
        return None
    if ":::" in target.read_text(encoding="utf-8"):  # API pages: anchors come from mkdocstrings
        return None
    if anchor not in _anchors(target):
        return f"names an anchor that {target.relative_to(ROOT)} does not have"
    return None


def _problem(page: Path, link: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", link):
        return _absolute_problem(link)
    return _relative_problem(page, link)


def test_every_link_resolves() -> None:
    dead = [
        f"{page.relative_to(ROOT)}: '{link}' {problem}"
        for page in _pages()
        for link in _targets(page)
        if (problem := _problem(page, link)) is not None
    ]
    assert dead == [], "\n".join(dead)


def test_the_check_finds_links() -> None:
    assert len(_targets(README)) >= 10 and sum(len(_targets(page)) for page in _pages()) >= 50


@pytest.mark.parametrize(
    ("heading", "mkdocs", "github"),
    [
        (
            "Collectives on the CPU: shm, gloo, MPI",
            "collectives-on-the-cpu-shm-gloo-mpi",
            "collectives-on-the-cpu-shm-gloo-mpi",
        ),
        ("`commlayer trace analyze`", "commlayer-trace-analyze", "commlayer-trace-analyze"),
        ("torch's stack -- any backend", "torchs-stack-any-backend", "torchs-stack----any-backend"),
    ],
)
def test_slugs_follow_mkdocs_and_github(heading: str, mkdocs: str, github: str) -> None:
    text = heading.replace("`", "")
    assert (mkdocs_slug(text), github_slug(text)) == (mkdocs, github)


def test_readme_is_a_front_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    for command in (
        "bash .ci/setup && .venv/bin/commlayer run -n 4 examples/allreduce.py",
        ".venv/bin/python -m pytest -q",
    ):
        assert command in text.split("## ")[0], command
    assert "\n## Install\n" in text and "\n## Quickstart\n" in text
