"""torch's wording and torch's leniency: bad and edge inputs against raw torch.distributed.

One world per backend runs each input on torch (gloo) and on commlayer and compares error types,
the leading words of their messages, and results: complex reductions other than SUM/AVG, an
empty scatter_object_list output, send to self, a coalesced all_reduce mixing complex and real
tensors, monitored_barrier with a timeout in seconds and naming the rank that did not arrive,
and torch ProcessGroups behind commlayer groups handed to commlayer's functions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from commlayer.testing import run_world

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("backend", ["gloo", "shm"])
def test_inputs_behave_as_in_torch(backend: str, tmp_path: Path) -> None:
    run_world(
        "tests.facade.torch_fidelity_ranks:main",
        2,
        backend=backend,
        timeout=120,
        args=[str(tmp_path / "store")],
    )
