"""``commlayer test-backend NAME -n 3 [--launcher local|mpirun]``: certify an installed backend.

The arguments are declared in :mod:`commlayer.cli`; this module runs the subcommand.

Starts a world of N ranks on the backend, runs the conformance suite on every rank, merges the
ranks' verdicts and prints the certificate table. Exit status 0 when every declared cell passed
and the world finished cleanly, 1 otherwise, 2 when the backend cannot run here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from commlayer.core.errors import BackendUnavailableError
from commlayer.testing.conformance.case import dtype_name
from commlayer.testing.conformance.certificate import Certificate
from commlayer.testing.conformance.values import DTYPES
from commlayer.testing.harness import run_world

__all__ = ["main"]

_TARGET = "commlayer.testing.conformance:main"
_REPORT_CHARS = 6000


def main(args: argparse.Namespace) -> int:
    """Run the suite on ``args.backend`` and print its certificate; returns the exit status."""
    try:
        launcher = args.launcher or _launcher_for(args.backend)
    except BackendUnavailableError as error:
        print(f"commlayer test-backend: {error}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="commlayer-certificate-") as directory:
        problem = _run(args, launcher, directory)
        certificate = _collect(args.backend, args.world_size, Path(directory))
    print(certificate.render(dtype_name(dtype) for dtype in DTYPES), flush=True)
    if problem is not None and not certificate.failures():
        print(f"\nthe world did not finish cleanly:\n{problem[-_REPORT_CHARS:]}", file=sys.stderr)
    return 0 if problem is None and certificate.passed else 1


def _launcher_for(name: str) -> str:
    from commlayer.contract.registry import (
        get_backend_class,  # imports torch: only this subcommand pays for it
    )

    return get_backend_class(name).launcher


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
