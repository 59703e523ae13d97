"""Lay out what torchtitan's debug configs read from the working directory: ``tests/assets/tokenizer``
(copied from ``SOURCE``) and ``tests/assets/c4_test/data.json``, a small corpus written here
(repeated lines of generated words, JSON lines with a "text" field, as the c4 test set has).

    python3 benchmarks/gpu/torchtitan_assets.py SOURCE_TOKENIZER_DIR WORKDIR
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "their",
    "been",
    "has",
    "would",
    "when",
    "if",
    "will",
    "more",
    "no",
]


def main() -> None:
    source, workdir = Path(sys.argv[1]), Path(sys.argv[2])
    assets = workdir / "tests" / "assets"
    shutil.copytree(source, assets / "tokenizer", dirs_exist_ok=True)
    corpus = assets / "c4_test"
    corpus.mkdir(parents=True, exist_ok=True)
    words = random.Random(0)
    with open(corpus / "data.json", "w") as out:
        for _ in range(4000):
            text = " ".join(words.choice(WORDS) for _ in range(400))
            out.write(json.dumps({"text": text}) + "\n")


if __name__ == "__main__":
    main()
