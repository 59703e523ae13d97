"""Builds only commlayer.backends.ccl._C, from the repository's csrc/ccl (see ../../setup.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import setup

_MAIN_SETUP = Path(__file__).resolve().parents[2] / "setup.py"


def _main_setup() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_commlayer_main_setup", _MAIN_SETUP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# "1": a missing oneCCL or a compile error fails this build loudly instead of shipping no binding.
setup(packages=[], ext_modules=_main_setup().ccl_extensions(mode="1"))
