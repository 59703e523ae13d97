"""``commlayer test-backend NAME -n 3 [--launcher local|mpirun]``: certify an installed backend.

NAME may also be a per-device spec such as ``cpu:gloo,cuda:peermem`` (the CUDA default): the
world then initialises with that spec and the suite certifies its primary backend (CUDA's where
there is one).

The arguments are declared in :mod:`commlayer.cli`; this module runs the subcommand.

Starts a world of N ranks on the backend, runs the conformance suite on every rank, merges the
ranks' verdicts and prints the certificate table. While the world runs, a line on stderr every
few seconds says how many cells each rank has checked and which one it checked last, so a slow
or stuck check shows where it is. Exit status 0 when every declared cell passed and the world
finished cleanly, 1 otherwise, 2 when the backend cannot run here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

from commlayer.core.errors import BackendUnavailableError, InvalidArgumentError
from commlayer.testing.conformance.case import dtype_name
from commlayer.testing.conformance.certificate import Certificate
from commlayer.testing.conformance.values import DTYPES
from commlayer.testing.harness import run_world

__all__ = ["main"]

_TARGET = "commlayer.testing.conformance:main"
_REPORT_CHARS = 6000
_PROGRESS_SECONDS = 10.0


def main(args: argparse.Namespace) -> int:
    """Run the suite on ``args.backend`` and print its certificate; returns the exit status."""
    try:
        launcher = args.launcher or _launcher_for(args.backend)
    except (BackendUnavailableError, InvalidArgumentError) as error:
        print(f"commlayer test-backend: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="commlayer-certificate-") as directory:
        problem = _run_reporting(args, launcher, directory)
        certificate = _collect(args.backend, args.world_size, Path(directory))
    print(certificate.render(dtype_name(dtype) for dtype in DTYPES), flush=True)
    if problem is not None and not certificate.failures():
        print(f"\nthe world did not finish cleanly:\n{problem[-_REPORT_CHARS:]}", file=sys.stderr)
    return 0 if problem is None and certificate.passed else 1


def _launcher_for(spec: str) -> str:
    """The launcher the backend asks for; for a per-device spec (``cpu:gloo,cuda:peermem``), the
    one its backends agree on (mpirun if any asks for it)."""
    # Imports torch: only this subcommand pays for it.
    from commlayer.contract.registry import get_backend_class
    from commlayer.contract.selection import parse_backend_spec

    names = set(parse_backend_spec(spec, lambda name: ("any",)).values())
    launchers = {get_backend_class(name).launcher for name in sorted(names)}
    return "mpirun" if "mpirun" in launchers else launchers.pop()


def _run_reporting(args: argparse.Namespace, launcher: str, directory: str) -> str | None:
    """_run, with a progress line on stderr every _PROGRESS_SECONDS while the world runs."""
    outcome: list[str | None] = []
    world = threading.Thread(target=lambda: outcome.append(_run(args, launcher, directory)), daemon=True)
    started = time.monotonic()
    world.start()
    world.join(_PROGRESS_SECONDS)
    while world.is_alive():
        print(progress_line(Path(directory), time.monotonic() - started), file=sys.stderr, flush=True)
        world.join(_PROGRESS_SECONDS)
    return outcome[0] if outcome else "the world's runner stopped without a result"


def progress_line(directory: Path, seconds: float) -> str:
    """``[20 s] cells checked: rank 0: 312 (last: all_reduce sum float32 world sync), ...``."""
    ranks = []
    for path in sorted(directory.glob("rank*.certificate.json")):
        try:
            verdicts = Certificate.read(path).verdicts
        except (OSError, ValueError, KeyError):
            continue  # being replaced right now: the next line will show it
        last = f" (last: {verdicts[-1].cell.label})" if verdicts else ""
        ranks.append(f"{path.name.split('.')[0]}: {len(verdicts)}{last}")
    checked = ", ".join(ranks) if ranks else "none yet (ranks starting)"
    return f"[{seconds:.0f} s] cells checked: {checked}"


def _run(args: argparse.Namespace, launcher: str, directory: str) -> str | None:
    """Run the world; the harness's report when it failed, else None."""
    try:
        run_world(
            _TARGET,
            args.world_size,
            backend=args.backend,
            timeout=args.timeout,
            launcher=launcher,
            args=(directory, "extensions") if getattr(args, "extensions", False) else (directory,),
        )
    except AssertionError as failure:
        return str(failure)
    return None


def _collect(backend: str, world_size: int, directory: Path) -> Certificate:
    files = sorted(directory.glob("rank*.certificate.json"))
    ranks = [Certificate.read(path) for path in files]
    return Certificate.merge(ranks) if ranks else Certificate(backend, world_size)
