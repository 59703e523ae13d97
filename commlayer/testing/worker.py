"""One rank of a run_world test: ``python -m commlayer.testing.worker [--backend B] TARGET [ARGS...]``.

With a backend, the process group is initialised (env:// rendezvous, from whichever launcher
started the rank) before ``TARGET(*ARGS)`` runs and destroyed after it returns. Any exception,
including one from init or from importing TARGET, is written to the results directory and the rank
exits 1, so the parent can show the traceback of every failing rank.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from commlayer.core import settings
from commlayer.core.rendezvous import discover
from commlayer.testing.results import ResultsDir

FAILURE_EXIT_CODE = 1


def main(argv: Sequence[str] | None = None) -> int:
    options = _parse(argv)
    results = ResultsDir(Path(settings.TESTING_RESULTS_DIR.required()))
    info = discover(os.environ)
    if info is None:
        raise RuntimeError(
            "commlayer.testing.worker: no launcher variables (RANK, OMPI_COMM_WORLD_RANK, PMI_RANK...) found"
        )
    # A forked rank is watched through its stand-in, which outlives it until its exit is reported.
    results.mark_started(info.rank, settings.TESTING_SUPERVISED_PID.value() or os.getpid())
    # When the harness stops a hung or bystander rank (SIGTERM), its Python stacks go to stderr
    # first, so the report shows where each rank was stuck.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    try:
        _run(options.target, tuple(options.args), options.backend)
    except SystemExit as request:
        if request.code not in (None, 0):
            return _report(results, info.rank)
    except BaseException:  # noqa: BLE001 - every failure, KeyboardInterrupt included, must reach the parent
        return _report(results, info.rank)
    results.mark_done(info.rank)
    return 0


def resolve_target(target: str) -> Callable[..., object]:
    """``"commlayer.testing.conformance:main"`` -> the function ``main`` of module ``commlayer.testing.conformance``."""
    module_name, _, function_name = target.partition(":")
    if not module_name or not function_name:
        raise ValueError(
            f"run_world: argument 'target' expected 'package.module:function', received {target!r}"
        )
    function = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(function):
        raise TypeError(
            f"run_world: argument 'target' names {function_name!r}, which module {module_name!r} does not define as a function"
        )
    return function


def _run(target: str, args: tuple[str, ...], backend: str | None) -> None:
    function = resolve_target(target)
    if backend is None:
        function(*args)
        return
    from commlayer import dist  # only ranks that want a process group pay for importing torch

    _bind_local_gpu()
    dist.init_process_group(backend=backend)
    function(*args)
    dist.destroy_process_group()


def _bind_local_gpu() -> None:
    """Put this rank on GPU LOCAL_RANK (modulo the GPUs visible), as torchrun scripts do first.

    Otherwise every rank's CUDA tensors and communicators land on GPU 0: NCCL refuses two ranks
    on one GPU, and peer-memory kernels of two ranks on one GPU take turns at its time slices.
    """
    import torch

    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None and torch.cuda.is_available():
        torch.cuda.set_device(int(local_rank) % torch.cuda.device_count())


def _report(results: ResultsDir, rank: int) -> int:
    text = traceback.format_exc()
    results.write_traceback(rank, text)
    sys.stderr.write(text)
    return FAILURE_EXIT_CODE


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m commlayer.testing.worker")
    parser.add_argument("--backend", default=None, help="initialise commlayer.dist with this backend first")
    parser.add_argument("target", help="package.module:function")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="strings passed to the function")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
