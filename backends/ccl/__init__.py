"""The ``ccl`` backend: Intel oneCCL through commlayer's own pybind11 binding.

Importing this package never loads oneCCL; :meth:`CclBackend.is_available` reports whether the
extension ``commlayer.backends.ccl._C`` was built and, if not, how to build it.
"""

from __future__ import annotations

from commlayer.backends.ccl.backend import INSTALL_HINT, CclBackend

__all__ = ["INSTALL_HINT", "CclBackend"]
