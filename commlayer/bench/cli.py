"""``commlayer bench``: collective microbenchmarks of every backend, side by side.

Two ways to run it:

* ``commlayer bench -n 4 ...`` starts 4 local ranks itself (through :mod:`commlayer.launch`);
  rank 0 hands its records back to this process, which prints and writes the outputs.
* ``torchrun --nproc-per-node 4 -m commlayer bench ...`` (or under mpirun / srun, e.g.
  ``mpirun -n 4 python -m commlayer bench --backends mpi``): every rank runs the sweep in place,
  rank 0 prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from commlayer.bench.cases import BENCH_OPS, check_values_exact
from commlayer.bench.metadata import run_metadata
from commlayer.bench.options import BENCH_DTYPES, BenchOptions
from commlayer.bench.progress import ProgressBar, follow_file
from commlayer.bench.records import BenchRecord, SweepResult, write_csv, write_json
from commlayer.bench.runner import count_steps, run_sweep
from commlayer.bench.table import RowPrinter, format_closing
from commlayer.core import settings
from commlayer.core.metrics import parse_size
from commlayer.core.rendezvous import discover
from commlayer.launch import LaunchConfig, launch
from commlayer.launch.nproc import resolve_nproc

__all__ = ["add_arguments", "main"]

OPTIONS_ENV = settings.BENCH_OPTIONS.name
RESULT_ENV = settings.BENCH_RESULT.name
PROGRESS_ENV = settings.BENCH_PROGRESS.name

#: Backends whose ranks must be started by a particular launcher (``-n`` cannot), and that launcher.
NEEDS_LAUNCHER = {"mpi": "mpirun", "mpi4py": "mpirun"}

_DESCRIPTION = """\
Time collectives on one or more backends and print nccl-tests-style tables.
time_us is the slowest rank's mean time per op; algbw = S / time_us; busbw = algbw x factor with
nccl-tests' factors (doc/PERFORMANCE.md): all_reduce 2(n-1)/n, all_gather and reduce_scatter
(n-1)/n with S the full buffer, all_to_all (n-1)/n, broadcast and pingpong 1. Note: DeepSpeed's
comms benchmark reports all_reduce bandwidth as 2S/t; we follow nccl-tests, so our all_reduce busbw
is (n-1)/n of DeepSpeed's figure.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``commlayer bench``'s options to ``parser`` (the subcommand parser of commlayer.cli)."""
    parser.description = _DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "-n",
        "--nproc-per-node",
        dest="nproc",
        type=_nproc,
        default=None,
        metavar="N",
        help="start N local ranks, or auto|gpu|cpu as torchrun (leave out under torchrun, mpirun or srun)",
    )
    parser.add_argument(
        "--backends",
        default=None,
        help="comma-separated backends to compare (default: this host's default backend, as "
        "init_process_group() picks it); also the references mpi4py (raw MPI, under mpirun) and memcpy",
    )
    parser.add_argument(
        "--ops",
        default=",".join(BENCH_OPS),
        help=f"comma-separated ops (default all: {','.join(BENCH_OPS)}); pingpong is "
        "send/recv between rank pairs, timed as half a round trip; put and get (not in the default) "
        "are one-sided window ops to the next rank (commlayer.window; mpi4py: raw MPI RMA)",
    )
    parser.add_argument(
        "-b", "--min-bytes", default="8", type=_size, help="smallest message S (default 8; K/M/G suffixes)"
    )
    parser.add_argument(
        "-e", "--max-bytes", default="32M", type=_size, help="largest message S (default 32M)"
    )
    parser.add_argument(
        "-f", "--step-factor", default=2.0, type=float, help="size multiplier between steps (default 2)"
    )
    parser.add_argument(
        "--dtype", default="float32", choices=list(BENCH_DTYPES), help="element type (default float32)"
    )
    parser.add_argument(
        "--iters", default=20, type=_positive_int, help="timed iterations per size (default 20)"
    )
    parser.add_argument("--warmup", default=5, type=int, help="untimed iterations per size first (default 5)")
    parser.add_argument(
        "--repeats",
        default=1,
        type=_positive_int,
        help="time --iters this many times per size, ranks aligned before each, and keep the best "
        "(the slowest rank's mean); other load on the machine only ever adds time (default 1)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="open every backend at once and let them take turns, repeat by repeat, at each size, "
        "so that a machine whose speed drifts during the run (a shared VM) charges the drift to "
        "all alike; compare with --repeats 3 or more (rows print when an op is done)",
    )
    parser.add_argument(
        "--async",
        dest="async_op",
        action="store_true",
        help="launch every iteration with async_op=True, then wait for all of them "
        "(they share buffers, as in nccl-tests)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="verify every timed iteration against exact expected values (default: one "
        "untimed verification run per size); 'wrong' counts wrong elements over all ranks",
    )
    parser.add_argument(
        "--device", default="auto", help="cpu, cuda, ... (default: the backend's accelerator if present)"
    )
    parser.add_argument(
        "--timeout", dest="timeout_s", default=300.0, type=float, help="seconds before a stuck rank fails"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the records as JSON, after a header saying where and how they were measured",
    )
    parser.add_argument("--csv", type=Path, default=None, metavar="FILE", help="write the records as CSV")
    parser.add_argument(
        "--plot", type=Path, default=None, metavar="FILE.png", help="plot busbw and small-size latency"
    )


def main(args: argparse.Namespace) -> int:
    try:
        options = _options(args)
        check_values_exact(options.torch_dtype, _world_size(args))
        if args.plot is not None:
            _require_matplotlib()
    except ValueError as error:
        print(f"commlayer bench: {error}", file=sys.stderr)
        return 2
    if args.nproc is not None:
        return _launch_local(options, args)
    return _run_in_place(options, args)


# --- the two modes ---------------------------------------------------------------------------


def _launch_local(options: BenchOptions, args: argparse.Namespace) -> int:
    if discover(os.environ) is not None:
        print(
            "commlayer bench: -n starts ranks itself; under torchrun, mpirun or srun leave it out",
            file=sys.stderr,
        )
        return 2
    runnable = _drop_launcher_bound(options, args.nproc)
    if runnable is None:
        return 2
    with tempfile.TemporaryDirectory(prefix="commlayer-bench-") as scratch:
        outcome = _run_ranks(runnable, args.nproc, Path(scratch))
    if isinstance(outcome, int):
        return outcome
    return _publish(outcome, runnable, args)


def _run_ranks(options: BenchOptions, nproc: int, scratch: Path) -> SweepResult | int:
    """Start the ranks, draw rank 0's progress here, return its result (or an exit code)."""
    result_path, progress_path = scratch / "result.json", scratch / "progress"
    env = {
        **os.environ,
        OPTIONS_ENV: options.to_json(),
        RESULT_ENV: str(result_path),
        PROGRESS_ENV: str(progress_path),
    }
    # No overall time limit: a 1 GiB CPU sweep takes long; a stuck op fails after --timeout.
    config = LaunchConfig((sys.executable, "-m", "commlayer.bench.worker"), nproc, env=env)
    bar, stop = ProgressBar(count_steps(options)), threading.Event()
    printer = RowPrinter(options, nproc)
    follower = threading.Thread(
        target=follow_file,
        args=(progress_path, bar, stop, lambda row, device: printer(BenchRecord(**row), device)),
        daemon=True,
    )
    follower.start()
    try:
        outcome = launch(config)
    finally:
        stop.set()
        follower.join()
    if outcome.exit_code != 0 or not result_path.exists():
        print(
            outcome.summary("commlayer bench") or "commlayer bench: rank 0 wrote no results", file=sys.stderr
        )
        return outcome.exit_code or 1
    return SweepResult.from_json(json.loads(result_path.read_text(encoding="utf-8")))


def _run_in_place(options: BenchOptions, args: argparse.Namespace) -> int:
    if discover(os.environ) is None:
        print(
            "commlayer bench: no launcher environment and no -n: running a world of 1 rank", file=sys.stderr
        )
    bar = ProgressBar(count_steps(options))
    try:
        result = run_sweep(options, bar.update, RowPrinter(options, _world_size(args)))
    finally:
        bar.close()
    if result is None:
        return 0  # not rank 0: rank 0 reports
    return _publish(result, options, args)


def _publish(result: SweepResult, options: BenchOptions, args: argparse.Namespace) -> int:
    """Print what follows the streamed rows, write the requested files (saying where); non-zero
    if any element was wrong."""
    print(format_closing(result), end="", flush=True)
    if args.json is not None:
        write_json(args.json, result.records, run_metadata())
        print(f"wrote {args.json}", flush=True)
    if args.csv is not None:
        write_csv(args.csv, result.records)
        print(f"wrote {args.csv}", flush=True)
    if args.plot is not None:
        from commlayer.bench.plot import write_plot  # matplotlib only when a plot is asked for

        write_plot(args.plot, result.records, _plot_title(result, options))
        print(f"wrote {args.plot}", flush=True)
    wrong = sum(record.wrong for record in result.records)
    if wrong:
        print(f"commlayer bench: {wrong} wrong elements (see the 'wrong' column)", file=sys.stderr)
        return 1
    return 0 if result.records else 1


# --- helpers ---------------------------------------------------------------------------------


def _options(args: argparse.Namespace) -> BenchOptions:
    # Each flag is named after a BenchOptions field; all but the two lists pass through as parsed.
    given = {field.name: getattr(args, field.name) for field in dataclasses.fields(BenchOptions)}
    given["backends"] = _names(args.backends or _host_default_backend())
    given["ops"] = _names(args.ops)
    return BenchOptions(**given)


def _require_matplotlib() -> None:
    """--plot's check before any rank starts: matplotlib comes with the optional "bench" part."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise ValueError("--plot needs matplotlib: pip install 'commlayer[bench]'") from None


def _host_default_backend() -> str:
    """What ``init_process_group()`` picks on this host (shm on a CPU host, nccl with CUDA)."""
    from commlayer.contract.registry import get_backend_class
    from commlayer.contract.selection import detect_accelerator, resolve_backend_spec

    def available(name: str) -> bool:
        try:
            get_backend_class(name)
        except Exception:  # noqa: BLE001 - unknown or unavailable: the next default is tried
            return False
        return True

    spec = resolve_backend_spec(None, os.environ, detect_accelerator(), available)
    return spec.split(",")[0].split(":")[-1]


def _world_size(args: argparse.Namespace) -> int:
    if args.nproc is not None:
        return int(args.nproc)
    found = discover(os.environ)
    return 1 if found is None else found.world_size


def _drop_launcher_bound(options: BenchOptions, nproc: int) -> BenchOptions | None:
    """Leave out backends that -n cannot start, saying how to run them; None if none is left."""
    keep = []
    for backend in options.backends:
        launcher = NEEDS_LAUNCHER.get(backend)
        if launcher is None or nproc == 1:
            keep.append(backend)
            continue
        how = f"{launcher} -n {nproc} {Path(sys.executable).name} -m commlayer bench {_arguments_without_nproc()}"
        print(
            f"commlayer bench: backend '{backend}' needs ranks started by {launcher}, which -n does not use; "
            f"skipping it. To include it, run:\n    {how.rstrip()}",
            file=sys.stderr,
        )
    if not keep:
        return None
    return BenchOptions(**{**options.__dict__, "backends": tuple(keep)})


def _arguments_without_nproc() -> str:
    """This invocation's bench arguments minus ``-n N``, for a copy-paste mpirun command."""
    arguments = sys.argv[1:]
    if "bench" in arguments:
        arguments = arguments[arguments.index("bench") + 1 :]
    kept, skip_value = [], False
    for argument in arguments:
        if skip_value:
            skip_value = False
        elif argument in ("-n", "--nproc-per-node"):
            skip_value = True
        elif not _is_attached_nproc(argument):
            kept.append(argument)
    return shlex.join(kept)


def _is_attached_nproc(argument: str) -> bool:
    """``-n4`` or ``--nproc-per-node=4``."""
    return (argument.startswith("-n") and not argument.startswith("--")) or argument.startswith(
        "--nproc-per-node="
    )


def _plot_title(result: SweepResult, options: BenchOptions) -> str:
    devices = ", ".join(sorted({device for _, device in result.devices})) or "?"
    return f"commlayer bench: {result.world_size} ranks on {devices}, {options.dtype}, {options.iters} iters"


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip().lower() for name in text.split(",") if name.strip())


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _nproc(text: str) -> int:
    try:
        return resolve_nproc(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("argument '-n' ")) from None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, received {text!r}")
    return int(text)


def standalone(argv: Sequence[str] | None = None) -> int:
    """``python -m commlayer.bench``: the same command without the ``commlayer`` front end."""
    parser = argparse.ArgumentParser(prog="commlayer bench")
    add_arguments(parser)
    return main(parser.parse_args(argv))
