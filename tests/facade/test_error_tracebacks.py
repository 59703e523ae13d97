"""Wiring: a commlayer error leaves the facade with the caller's own frame last, its message once.

In-process, each error's ``__traceback__`` is read directly: below the test's frame there must be
no frame of commlayer's (``COMMLAYER_FULL_TRACEBACK=1`` keeps them, for whoever debugs commlayer).
A script run as a user would shows what is printed: the user's lines, then the one message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.core.errors import CommError
from commlayer.core.ports import free_port

REPO = Path(__file__).resolve().parents[2]
COMMLAYER_SOURCES = (str(REPO / "commlayer"), str(REPO / "backends"))


def _internal_frames(error: BaseException) -> list[str]:
    return [
        f"{frame.filename}:{frame.lineno}"
        for frame in traceback.extract_tb(error.__traceback__)
        if frame.filename.startswith(COMMLAYER_SOURCES)
    ]


def _raised(call: Callable[[], object]) -> CommError:
    with pytest.raises(CommError) as raised:
        call()
    return raised.value


CALLS = {
    "all_reduce (hot, inline)": lambda: dist.all_reduce(torch.ones(4), op="summ"),
    "all_gather_into_tensor (hot, inline)": lambda: dist.all_gather_into_tensor(
        torch.zeros(3), torch.ones(4)
    ),
    "send (hot, inline)": lambda: dist.send(torch.ones(2), dst=0),
    "gather (decorated)": lambda: dist.gather(torch.ones(2), None, dst=3),
    "new_group (decorated)": lambda: dist.new_group([0, 5]),
    "wait on a Work": lambda: dist.all_reduce(torch.ones(2), async_op=True, timeout=-1.0),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_errors_keep_only_the_callers_frames(world_of_one: None, name: str) -> None:
    error = _raised(CALLS[name])
    assert _internal_frames(error) == [], (name, error)
    assert error.__cause__ is None and error.__suppress_context__, name


def test_errors_before_init_keep_only_the_callers_frames() -> None:
    assert _internal_frames(_raised(lambda: dist.get_rank())) == []
    assert _internal_frames(_raised(lambda: dist.broadcast(torch.ones(1), src=0))) == []
    unavailable = _raised(
        lambda: dist.init_process_group("nope", store=torch_dist.HashStore(), rank=0, world_size=1)
    )
    assert _internal_frames(unavailable) == [] and "\n" not in str(unavailable)


def test_full_traceback_keeps_the_internal_frames(
    world_of_one: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMMLAYER_FULL_TRACEBACK", "1")
    error = _raised(CALLS["all_reduce (hot, inline)"])
    assert any("validate.py" in frame for frame in _internal_frames(error)), _internal_frames(error)


SCRIPT = """
import torch
from commlayer import dist

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(4), op="summ")
"""


def test_a_users_script_prints_its_own_lines_and_the_message_once(tmp_path: Path) -> None:
    script = tmp_path / "typo.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    env["COMMLAYER_TRACE_DIR"] = str(tmp_path / "traces")
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    # torch's convention under RANK: each line of an uncaught error is prefixed with the rank.
    printed = [line.removeprefix("[rank0]: ") for line in run.stderr.splitlines()]
    lines = [line for line in printed if not line.startswith("commlayer: flight recorder")]
    assert lines == [
        "Traceback (most recent call last):",
        f'  File "{script}", line 6, in <module>',
        '    dist.all_reduce(torch.ones(4), op="summ")',
        (
            "commlayer.core.errors.InvalidArgumentError: all_reduce: argument 'op' expected a ReduceOp (SUM, "
            "AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR), received summ (rank 0)"
        ),
    ], run.stderr
