"""The shm backend's native errors surface as commlayer's public types, as the docs promise."""

from __future__ import annotations

import pytest

from commlayer.testing import run_world

pytestmark = pytest.mark.multirank


def test_shm_mismatch_and_timeout_surface_as_public_types() -> None:
    run_world("tests.backends.shm_public_errors_ranks:run", 2, backend="gloo", timeout=120)
