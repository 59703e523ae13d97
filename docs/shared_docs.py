"""Griffe extension: the API reference gets the facade's shared docstring paragraphs put in, as
commlayer.facade.calls.docstrings.shared_docs does at import (mkdocs.yml loads it)."""

from __future__ import annotations

from typing import Any

import griffe

from commlayer.facade.calls.docstrings import expand


class SharedDocs(griffe.Extension):
    """Expands every ``{{name}}`` line of a function's docstring."""

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        if func.docstring is not None and "{{" in func.docstring.value:
            func.docstring.value = expand(func.docstring.value)
