"""Starting whole scripts under the launchers users use (accelerate launch, torchrun, commlayer run)."""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from commlayer.core import settings
from commlayer.launch import ProcessSpec, SuperviseOptions, supervise

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TAKEOVER = {settings.TORCH_TAKEOVER.name: "1"}
_REPORT = re.compile(r"process group: (\w+); loss (\S+)")


def free_port() -> int:
    """A TCP port nobody listens on now (for a world whose launcher sets no MASTER_PORT)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# torch's gloo process group can abort a rank at interpreter exit, after the script has finished
# and destroyed its group (std::terminate from a joinable thread): seen in 1 of 8 runs of the
# Accelerate example on stock torch with commlayer not even imported.
EXIT_RACE = "terminate called without an active exception"


def run_script(argv: Sequence[str], env: Mapping[str, str] = {}, timeout: float = 240) -> str:
    """Run ``argv`` (a launcher and its script) to the end; its output, or AssertionError with it.

    A run that aborted only at exit in torch's own race (``EXIT_RACE``) is run once more."""
    output, passed = _run_once(argv, env, timeout)
    if not passed and EXIT_RACE in output:
        output, passed = _run_once(argv, env, timeout)
    assert passed, f"{' '.join(argv)} failed:\n{output}"
    return output


def _run_once(argv: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[str, bool]:
    options = SuperviseOptions(
        timeout=timeout, echo=False, forward_signals=False, kill_grace=1.0, tail_lines=60
    )
    result = supervise([ProcessSpec("launcher", tuple(argv), script_environment(env))], options)
    output = "\n".join(result.outcomes[0].output_tail)
    return output, result.exit_code == 0 and not result.timed_out


def script_environment(env: Mapping[str, str] = {}) -> dict[str, str]:
    """This environment without the switch, the checkout importable, then ``env``."""
    environ = {key: value for key, value in os.environ.items() if key != settings.TORCH_TAKEOVER.name}
    return {**environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **env}


def mpirun(nproc: int, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The mpirun command (with its environment) that starts ``nproc`` ranks of a script."""
    from commlayer.testing import mpirun_plan, require_mpirun

    require_mpirun()
    plan = mpirun_plan(nproc, script_environment(env))
    return [*plan.argv, sys.executable], plan.env


def reported(output: str) -> tuple[str, float]:
    """The process group's backend and the final loss that an example script printed."""
    found = _REPORT.findall(output)
    assert len(found) == 1, f"expected one 'process group: ...; loss ...' line, received:\n{output}"
    backend, loss = found[0]
    return backend, float(loss)


def example(name: str) -> str:
    return str(REPO / "examples" / "frameworks" / name)


def commlayer_run(*args: str) -> list[str]:
    return [str(BIN / "commlayer"), "run", *args]


def torchrun(nproc: int, *args: str) -> list[str]:
    return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(nproc), *args]
