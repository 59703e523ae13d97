"""Lightning's DDPStrategy on commlayer (``process_group_backend="commlayer"``): the final loss
equals the same run on torch's gloo, 2 ranks on shm (Lightning starts them itself) and on mpi
(mpirun starts them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.frameworks.launchers import REPO, mpirun, run_script

pytestmark = [pytest.mark.frameworks, pytest.mark.multirank]
pytest.importorskip("lightning")

SCRIPT = str(REPO / "tests" / "frameworks" / "lightning_ranks.py")


def _fit(tmp_path: Path, backend: str, launcher: list[str], env: dict[str, str]) -> dict[str, object]:
    out = tmp_path / f"{backend}-{len(launcher)}.json"
    run_script([*launcher, SCRIPT, backend, str(out)], env)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def gloo_loss(tmp_path_factory: pytest.TempPathFactory) -> float:
    result = _fit(tmp_path_factory.mktemp("gloo"), "gloo", [sys.executable], {})
    assert result["backend"] == "gloo"
    return result["loss"]


def test_ddp_strategy_on_shm_equals_gloo(tmp_path: Path, gloo_loss: float) -> None:
    result = _fit(tmp_path, "commlayer", [sys.executable], {"COMMLAYER_BACKEND": "shm"})
    assert result == {"backend": "commlayer", "loss": gloo_loss}


@pytest.mark.mpi
def test_ddp_strategy_on_mpi_under_mpirun_equals_gloo(tmp_path: Path, gloo_loss: float) -> None:
    argv, env = mpirun(2, {"COMMLAYER_BACKEND": "mpi"})
    out = tmp_path / "mpi.json"
    run_script([*argv, SCRIPT, "commlayer", str(out)], env)
    assert json.loads(out.read_text()) == {"backend": "commlayer", "loss": gloo_loss}
