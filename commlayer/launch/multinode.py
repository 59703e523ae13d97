"""``commlayer run --hostfile FILE``: one job across hosts, through ssh, pdsh, mpirun or srun.

The launcher's processes (an ssh per host, or one pdsh / mpirun / srun) are supervised like local
ranks: the first to fail stops the others. Ranks on several hosts often fail together (a killed
rank breaks its peers' connections), so the runner waits :data:`SETTLE_SECONDS` for the other
hosts' reports and names the rank whose failure came first by the agents' clocks::

    commlayer run: rank 3 on node2 was killed by SIGKILL (exit code 137); stopped every other host
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from commlayer.core import settings
from commlayer.launch.commands import JobPlan, mpirun_argv, pdsh_argv, srun_argv, ssh_argv
from commlayer.launch.report import fit_summary
from commlayer.launch.supervise import LaunchResult, ProcessOutcome, ProcessSpec, SuperviseOptions, supervise

__all__ = [
    "SETTLE_SECONDS",
    "HostsRun",
    "find_mpirun",
    "first_rank_failure",
    "host_processes",
    "mpirun_flavor",
    "run_across_hosts",
    "search_path",
]

SETTLE_SECONDS = 1.0
_REPORT = re.compile(r"^commlayer run on \S+: (?P<what>.*) \[at (?P<time>\d+(\.\d+)?)\]$")


@dataclass(frozen=True)
class HostsRun:
    result: LaunchResult
    summary: str | None  # one line for the user; None when every rank succeeded
    exit_code: int


def run_across_hosts(
    plan: JobPlan, launcher: str, options: SuperviseOptions, environ: Mapping[str, str]
) -> HostsRun:
    """Start ``plan`` with ``launcher`` and wait; stop every host on the first failure."""
    specs = host_processes(plan, launcher, environ)
    result = supervise(specs, replace(options, settle=max(options.settle, SETTLE_SECONDS)))
    first = first_rank_failure(result)
    if first is None:
        return HostsRun(result, result.summary(), result.exit_code)
    what, code = first
    return HostsRun(result, fit_summary(f"commlayer run: {what}; stopped every other host"), code)


def host_processes(plan: JobPlan, launcher: str, environ: Mapping[str, str]) -> list[ProcessSpec]:
    """What this machine runs: an ssh per host, or one pdsh, mpirun or srun for all of them."""
    env = dict(environ)
    if launcher == "ssh":
        return [
            ProcessSpec(f"{entry.host} (ssh)", tuple(ssh_argv(plan, index)), env, tag="", stdin_signals=True)
            for index, entry in enumerate(plan.hosts)
        ]
    if launcher == "pdsh":
        argv, extra = pdsh_argv(plan)
        return [ProcessSpec("pdsh", tuple(argv), {**env, **extra}, tag="")]
    if launcher == "mpirun":
        # Launchers find their helpers (mpiexec.hydra, hydra_pmi_proxy, prted) on PATH.
        env["PATH"] = search_path(env)
        executable = find_mpirun(env)
        argv = mpirun_argv(plan, mpirun_flavor(executable, env), executable)
        return [ProcessSpec("mpirun", tuple(argv), env, tag="")]
    if launcher == "srun":
        return [ProcessSpec("srun", tuple(srun_argv(plan)), env, tag="")]
    raise ValueError(
        f"commlayer run: argument '--launcher' expected ssh, pdsh, mpirun or srun, received {launcher!r}"
    )


def find_mpirun(environ: Mapping[str, str]) -> str:
    """``$COMMLAYER_MPIRUN`` or ``mpirun``, looked up on PATH after this interpreter's own bin folder."""
    name = settings.MPIRUN.text(environ) or "mpirun"
    found = shutil.which(name, path=search_path(environ))
    if found is None:
        raise ValueError(
            f"commlayer run: --launcher mpirun expected an mpirun on PATH or in $COMMLAYER_MPIRUN, received {name!r}"
        )
    return found


def search_path(environ: Mapping[str, str]) -> str:
    """PATH with this interpreter's bin folder first (a venv's mpirun, used without activating it)."""
    return os.pathsep.join([str(Path(sys.executable).parent), environ.get("PATH", os.defpath)])


def mpirun_flavor(executable: str, environ: Mapping[str, str]) -> str:
    """ "openmpi" when ``executable --version`` says Open MPI, else "hydra" (MPICH, Intel MPI)."""
    try:
        shown = subprocess.run(
            [executable, "--version"],
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "hydra"
    return "openmpi" if "Open MPI" in shown.stdout + shown.stderr else "hydra"


def first_rank_failure(result: LaunchResult) -> tuple[str, int] | None:
    """The earliest agent report among the hosts that failed by themselves: (what, exit code)."""
    reports = [
        (float(match["time"]), match["what"], outcome)
        for outcome in result.outcomes
        if outcome.exit_code != 0 and not outcome.stopped
        for match in map(_REPORT.match, outcome.output_tail)
        if match is not None
    ]
    if not reports:
        return None
    _, what, outcome = min(reports, key=lambda report: report[0])
    return what.split("; ")[0], _shell_code(outcome)


def _shell_code(outcome: ProcessOutcome) -> int:
    return 128 - outcome.exit_code if outcome.exit_code < 0 else outcome.exit_code
