"""One-sided windows: ``commlayer.window(tensor, group)`` and its :class:`Window` (see :mod:`.window`)."""

from commlayer.windows.window import Window, window

__all__ = ["Window", "window"]
