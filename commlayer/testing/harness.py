"""run_world: run one function on every rank of a fresh world and turn any failure into one assert.

Every multi-rank test in the project goes through here::

    run_world("commlayer.testing.conformance:main", 4)               # 4 local ranks, gloo process group
    run_world("tests.backends.mpi_ranks:main", 3, backend="mpi", launcher="mpirun", args=["float64"])

Each rank runs ``python -m commlayer.testing.worker`` (see ``worker.py``). The first rank to fail
stops the world, a timeout stops it too, and the AssertionError then carries the traceback of every
rank that raised plus the tail of every rank's output (under mpirun: of mpirun's tagged output).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from commlayer.core.shm_files import release_stale_regions
from commlayer.launch import LaunchConfig, LaunchResult, ProcessSpec, SuperviseOptions, launch, supervise
from commlayer.testing.fork_server import warm_command
from commlayer.testing.mpi import mpirun_plan, mpirun_unavailable_reason
from commlayer.testing.results import RESULTS_DIR_ENV, ResultsDir

__all__ = ["WorldLauncher", "require_mpirun", "run_world"]

_LAUNCHERS = ("local", "mpirun")
_KILL_GRACE_SECONDS = 1.0
# After the first failure, how long a rank that is ending too still counts as ended, not stopped: a
# warm-started rank's exit reaches the supervisor through its stand-in, a little later.
_SETTLE_SECONDS = 0.5
_TAIL_LINES = 30
# Variables of an outer launcher (pytest itself under torchrun) must not leak into the test world.
_OUTER_LAUNCHER_VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class WorldLauncher(Protocol):
    """Starts a world some other way (e.g. across the hosts of a test cluster, see cluster_worlds).

    ``processes`` returns what the harness supervises: launcher processes (torchrun agents,
    mpirun) or the ranks themselves, in any order; ``command`` is the rank program and ``env``
    the ranks' environment (results directory and PYTHONPATH included).
    """

    name: str

    def processes(
        self, command: tuple[str, ...], env: Mapping[str, str], world_size: int
    ) -> list[ProcessSpec]: ...


def run_world(
    target: str,
    world_size: int,
    *,
    backend: str | None = "gloo",
    timeout: float = 120.0,
    launcher: str | WorldLauncher = "local",
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> None:
    """Run ``target(*args)`` on ranks 0..world_size-1; raise AssertionError if any rank fails.

    ``target`` is ``"package.module:function"``, importable from the repository root (the rank's
    PYTHONPATH gets the target's import root and the current directory). With ``backend`` set, each
    rank calls ``commlayer.dist.init_process_group(backend=backend)`` (env://) first and
    ``destroy_process_group()`` after; ``backend=None`` leaves initialisation to the function.
    ``launcher="mpirun"`` starts the ranks with the mpirun that matches mpi4py's MPI library (see
    :mod:`commlayer.testing.mpi`); it sets no MASTER_ADDR/MASTER_PORT unless ``env`` does.
    A :class:`WorldLauncher` object starts the world its own way (torchrun agents on several
    hosts, mpirun across hosts, srun-style ranks); failures are then found as under mpirun.
    """
    _check_arguments(target, world_size, timeout, launcher, args)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="commlayer-world-") as directory:
        results = ResultsDir(Path(directory))
        rank_env = _rank_environment(target, env, results)
        command = _worker_command(target, backend, args)
        # Locally a raising rank's exit code stops the world; under mpirun only its traceback can.
        watch = _RanksWatch(results, watch_tracebacks=launcher != "local")
        options = SuperviseOptions(
            timeout=timeout,
            echo=False,
            forward_signals=False,
            kill_grace=_KILL_GRACE_SECONDS,
            settle=_SETTLE_SECONDS,
            tail_lines=_TAIL_LINES * (1 if launcher == "local" else world_size),
            stop_check=watch,
        )
        if launcher == "local":
            warm = warm_command(command, rank_env)
            result = launch(LaunchConfig(warm, world_size, env=rank_env, options=options))
        elif not isinstance(launcher, str):
            result = supervise(launcher.processes(command, rank_env, world_size), options)
        else:
            plan = mpirun_plan(world_size, rank_env)
            result = supervise([ProcessSpec("mpirun", (*plan.argv, *command), plan.env)], options)
        state = _WorldState.read(results, watch)
        release_stale_regions(started)
        problems = _problems(world_size, result, state, local=launcher == "local")
        name = launcher if isinstance(launcher, str) else launcher.name
        report = _report(target, world_size, name, backend, problems, result, state) if problems else None
    if report is not None:
        raise AssertionError(report)


def require_mpirun() -> None:
    """Skip the calling pytest test when mpirun mode cannot run on this machine."""
    reason = mpirun_unavailable_reason()
    if reason is not None:
        import pytest

        pytest.skip(f"mpirun mode unavailable: {reason}")


def _check_arguments(
    target: str, world_size: int, timeout: float, launcher: str | WorldLauncher, args: Sequence[str]
) -> None:
    module, _, function = target.partition(":") if isinstance(target, str) else ("", "", "")
    if not module or not function:
        raise ValueError(
            f"run_world: argument 'target' expected 'package.module:function', received {target!r}"
        )
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            f"run_world: argument 'world_size' expected an integer >= 1, received {world_size!r}"
        )
    if not timeout > 0:
        raise ValueError(
            f"run_world: argument 'timeout' expected a positive number of seconds, received {timeout!r}"
        )
    if isinstance(launcher, str) and launcher not in _LAUNCHERS:
        raise ValueError(
            f"run_world: argument 'launcher' expected one of {_LAUNCHERS}, received {launcher!r}"
        )
    if isinstance(args, str) or not all(isinstance(arg, str) for arg in args):
        raise ValueError(f"run_world: argument 'args' expected a sequence of strings, received {args!r}")


def _rank_environment(target: str, env: Mapping[str, str] | None, results: ResultsDir) -> dict[str, str]:
    merged = {key: value for key, value in os.environ.items() if key not in _OUTER_LAUNCHER_VARIABLES}
    merged.update(env or {})
    inherited = [entry for entry in merged.get("PYTHONPATH", "").split(os.pathsep) if entry]
    roots = _import_roots(target.partition(":")[0])
    merged["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*roots, *inherited]))
    merged["PYTHONUNBUFFERED"] = "1"
    merged[RESULTS_DIR_ENV] = str(results.path)
    return merged


def _import_roots(module_name: str) -> list[str]:
    """The sys.path entry this process finds ``module_name`` under, then the current directory."""
    roots = [os.getcwd()]
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None  # the rank will report the ImportError with its traceback
    if spec is not None and spec.origin and os.path.isfile(spec.origin):
        levels = module_name.count(".") + (1 if spec.submodule_search_locations else 0)
        roots.insert(0, str(Path(spec.origin).resolve().parents[levels]))
    return roots


def _worker_command(target: str, backend: str | None, args: Sequence[str]) -> tuple[str, ...]:
    backend_option = ("--backend", backend) if backend is not None else ()
    return (sys.executable, "-m", "commlayer.testing.worker", *backend_option, target, *args)


class _RanksWatch:
    """stop_check: a rank that raised or vanished stops the world even when its exit code is 0 or
    unknown (os._exit(0) locally; under mpirun, Hydra keeps waiting for the other ranks)."""

    def __init__(self, results: ResultsDir, watch_tracebacks: bool) -> None:
        self.results = results
        self.watch_tracebacks = watch_tracebacks
        self.vanished: list[int] = []

    def __call__(self) -> str | None:
        failed = sorted(self.results.tracebacks()) if self.watch_tracebacks else []
        if failed:
            return f"{_ranks(failed)} raised"
        self.vanished = self.results.vanished()
        return f"{_ranks(self.vanished)} died" if self.vanished else None


@dataclass(frozen=True)
class _WorldState:
    tracebacks: dict[int, str]
    started: frozenset[int]
    done: frozenset[int]
    vanished: tuple[int, ...]  # seen gone, unfinished and without a traceback while the world ran

    @classmethod
    def read(cls, results: ResultsDir, watch: _RanksWatch) -> _WorldState:
        return cls(
            results.tracebacks(),
            frozenset(results.started()),
            frozenset(results.done()),
            tuple(watch.vanished),
        )

    def unfinished(self, world_size: int) -> list[int]:
        return sorted(set(range(world_size)) - self.done - set(self.tracebacks))


def _problems(world_size: int, result: LaunchResult, state: _WorldState, local: bool) -> list[str]:
    problems = []
    if result.timed_out:
        never = sorted(set(range(world_size)) - state.started)
        problems.append(
            f"timed out after {result.timeout:g}s with {_ranks(state.unfinished(world_size))} still running"
            + (f" ({_ranks(never)} never started)" if never else "")
        )
    if state.tracebacks:
        problems.append(f"{_ranks(state.tracebacks)} raised")
    silent = _silent_deaths(result, state) if local else {rank: None for rank in state.vanished}
    for rank, code in silent.items():
        how = "exited" if code is None else f"exited with code {code}"
        problems.append(
            f"rank {rank} {how} before its target returned, without a Python traceback "
            "(os._exit, a crash or a signal)"
        )
    unfinished = [rank for rank in state.unfinished(world_size) if rank not in silent]
    if not problems and unfinished:
        how = (
            ""
            if result.exit_code == 0
            else f" ({result.outcomes[0].label} exited with code {result.exit_code})"
        )
        problems.append(f"{_ranks(unfinished)} never returned from the target{how}")
    if not problems and result.exit_code != 0:
        problems.append(
            f"{result.outcomes[0].label} exited with code {result.exit_code} after every rank finished"
        )
    if problems and result.stopped_labels:
        problems.append(f"the harness stopped {', '.join(result.stopped_labels)}")
    return problems


def _silent_deaths(result: LaunchResult, state: _WorldState) -> dict[int, int | None]:
    """Local ranks that ended by themselves (not stopped) with neither a traceback nor a done marker."""
    return {
        rank: outcome.exit_code
        for rank, outcome in enumerate(result.outcomes)
        if not outcome.stopped and rank not in state.tracebacks and rank not in state.done
    }


def _report(
    target: str,
    world_size: int,
    launcher: str,
    backend: str | None,
    problems: list[str],
    result: LaunchResult,
    state: _WorldState,
) -> str:
    sections = [
        f"run_world({target!r}, {world_size}, launcher={launcher!r}, backend={backend!r}) failed: "
        + "; ".join(problems)
    ]
    for rank in sorted(state.tracebacks):
        sections.append(f"---- rank {rank} traceback ----\n{state.tracebacks[rank].rstrip()}")
    for outcome in result.outcomes:
        how = f"exit code {outcome.exit_code}" + (", stopped by the harness" if outcome.stopped else "")
        tail = "\n".join(outcome.output_tail) or "(no output)"
        sections.append(
            f"---- {outcome.label} output ({how}), last {len(outcome.output_tail)} lines ----\n{tail}"
        )
    return "\n\n".join(sections)


def _ranks(ranks: Iterable[int]) -> str:
    ordered = sorted(ranks)
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(map(str, ordered))
