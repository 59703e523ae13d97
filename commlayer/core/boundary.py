"""The facade's boundary: commlayer's errors reach the caller with the caller's own line last.

A commlayer error (every :class:`~commlayer.core.errors.CommError`: a rejected argument, a
mismatch, a timeout, a dead peer) is raised deep inside the facade, so its traceback would list
the facade's internal frames (validation, staging, plans, the backend's check) under the
caller's. Each public function catches it, cuts its traceback with :func:`hide_internal_frames`
and re-raises it with a bare ``raise``, which adds no frame; Python then adds only the callers'
frames, so the traceback ends at the user's call, and the message, complete in itself, is
printed once. The raw library error a translated message already quotes (its ``__cause__``) is
dropped with the frames.

``COMMLAYER_FULL_TRACEBACK=1`` keeps both, for whoever debugs commlayer itself. Anything that is
not a commlayer error (a bug) keeps every frame. Cold functions use :func:`user_facing`; the hot
ops write the three lines inline, where a wrapper's extra frame would be measurable::

    try:
        ...
    except CommError as error:
        hide_internal_frames(error)
        raise
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from commlayer.core import settings
from commlayer.core.errors import CommError

__all__ = ["hide_internal_frames", "user_facing"]

Function = TypeVar("Function", bound=Callable[..., Any])


def hide_internal_frames(error: BaseException) -> bool:
    """Cut ``error``'s traceback and chain, unless ``COMMLAYER_FULL_TRACEBACK`` keeps them (then
    False); call it in the public function's ``except`` block, then ``raise``."""
    if settings.FULL_TRACEBACK.value():
        return False
    error.__traceback__ = None
    error.__cause__ = None
    error.__suppress_context__ = True
    return True


def user_facing(function: Function) -> Function:
    """Decorate a public function so that commlayer's errors leave it as :func:`hide_internal_frames` says."""

    @functools.wraps(function)
    def public(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except CommError as error:
            hide_internal_frames(error)
            raise

    return public  # type: ignore[return-value]
