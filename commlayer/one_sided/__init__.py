"""One-sided windows below the user layer: the contract a backend's window follows
(:mod:`.contract`) and the two-sided emulation every backend gets by default (:mod:`.two_sided`).

The user-facing API is :mod:`commlayer.windows` (``commlayer.window(tensor, group)``).
"""

from .contract import BackendWindow, PollWork, WindowSpec
from .two_sided import TwoSidedWindow

__all__ = ["BackendWindow", "PollWork", "TwoSidedWindow", "WindowSpec"]
