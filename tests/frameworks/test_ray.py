"""Ray Train on commlayer (``TorchConfig(backend="commlayer")``): 2 CPU workers on shm reach the
final loss the same run reaches on torch's gloo."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.frameworks.launchers import REPO, run_script

pytestmark = [pytest.mark.frameworks, pytest.mark.multirank]
pytest.importorskip("ray.train")


def test_torch_trainer_on_shm_equals_gloo(tmp_path: Path) -> None:
    output = run_script([sys.executable, str(REPO / "tests" / "frameworks" / "ray_driver.py"), str(tmp_path)])
    results = json.loads(output.strip().splitlines()[-1])
    assert results["commlayer"] == {"backend": "commlayer", "loss": results["gloo"]["loss"]}
    assert results["gloo"]["backend"] == "gloo"
