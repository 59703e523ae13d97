"""The zero-change switch on unmodified scripts: an Accelerate script and a Trainer script, neither
naming commlayer, run on commlayer's process group under ``COMMLAYER_TORCH_TAKEOVER=1`` set for their
own launcher, and reach the loss they reach on torch's gloo, which they get with the switch off
(``commlayer run --torch-takeover``, their ``Run:`` line, is test_examples.py's)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.frameworks.launchers import (
    BIN,
    TAKEOVER,
    commlayer_run,
    example,
    free_port,
    reported,
    run_script,
    torchrun,
)

pytestmark = [pytest.mark.frameworks, pytest.mark.multirank]


def _same_loss_on_commlayer(own_launcher: Sequence[str], script: str) -> None:
    backend, reference = reported(run_script([*own_launcher, script]))
    assert backend == "gloo"  # the switch off: torch's own group, as the framework asked
    assert reported(run_script([*own_launcher, script], TAKEOVER)) == ("commlayer", reference)
    assert reported(run_script(commlayer_run("--torch-takeover", "-n", "2", script))) == (
        "commlayer",
        reference,
    )


def test_accelerate_script_runs_on_commlayer_under_the_switch() -> None:
    pytest.importorskip("accelerate")
    accelerate_launch = [
        str(BIN / "accelerate"),
        "launch",
        "--multi_gpu",
        *("--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"),
        *("--dynamo_backend", "no", "--main_process_port", str(free_port())),
    ]
    _same_loss_on_commlayer(accelerate_launch, example("accelerate_train.py"))


def test_trainer_script_runs_on_commlayer_under_the_switch() -> None:
    pytest.importorskip("transformers")
    _same_loss_on_commlayer(torchrun(2), example("trainer_train.py"))
