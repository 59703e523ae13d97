"""The docstring paragraphs the facade's ops share, written once.

An op's docstring names a shared paragraph by a line of its own, ``{{name}}``, indented where the
paragraph goes; :func:`shared_docs` puts the paragraph in at import (the API reference does the
same when it is built, through docs/shared_docs.py). Example::

    @shared_docs
    def barrier(group=None, async_op=False, *, timeout=None):
        '''Block until every rank of ``group`` has entered the barrier.

        Args:
            {{group}}
            {{async_op}}
            {{timeout}}
        '''
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeVar

__all__ = ["PARAGRAPHS", "expand", "shared_docs"]

PARAGRAPHS = {
    "group": "group (ProcessGroup, optional): the group to work on; None is the default (world) group.",
    "async_op": "async_op (bool, optional): return a Work to wait on instead of waiting here.",
    "timeout": (
        "timeout (timedelta or float, optional): a commlayer extension (torchcomms' keyword): how long\n"
        "    this call may take; past it, CommTimeoutError names the op, group and rank (and an\n"
        "    async call's Work carries the deadline). None: the group's timeout."
    ),
    "work": (
        "A :class:`~commlayer.core.work.Work` if ``async_op`` is True, else None; None also on a rank\n"
        "outside ``group``, which does nothing."
    ),
    "argument errors": (
        "InvalidArgumentError: (a ValueError; InvalidTypeError is also a TypeError) an argument was\n"
        "    rejected before any communication; UnsupportedError when the backend does not declare\n"
        "    the op, dtype, device or reduce op."
    ),
    "timeout errors": "CommTimeoutError: the op did not complete within ``timeout`` or the group's timeout.",
    "peer failure": "PeerFailureError: a rank of the group died while the op was in flight.",
}

_MARKER = re.compile(r"^( *)\{\{([a-z_ ]+)\}\}$", re.MULTILINE)
Function = TypeVar("Function", bound=Callable[..., object])


def expand(docstring: str) -> str:
    """``docstring`` with every ``{{name}}`` line replaced by its paragraph, at the line's indent."""

    def paragraph(match: re.Match[str]) -> str:
        indent, name = match.groups()
        return "\n".join(indent + line for line in PARAGRAPHS[name].splitlines())

    return _MARKER.sub(paragraph, docstring)


def shared_docs(function: Function) -> Function:
    """``function`` with its docstring's shared paragraphs put in (see the module docstring)."""
    if function.__doc__:
        function.__doc__ = expand(function.__doc__)
    return function
