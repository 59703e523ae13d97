"""The ``commlayer`` command: ``run`` launches ranks (here, or across hosts with ``--hostfile``),
``bench`` benchmarks, ``backends`` lists, ``trace analyze DIR`` explains flight-recorder dumps,
``test-backend`` certifies a backend with the conformance kit.

``commlayer bench`` lives in :mod:`commlayer.bench.cli` (``add_arguments(parser)`` and
``main(args) -> int``); it is imported only when that subcommand is asked for, so ``run`` works
without the benchmark's dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from commlayer import __version__
from commlayer.core import settings
from commlayer.core.job import JOB_ID_ENV, new_job_id
from commlayer.launch import LaunchConfig, LaunchResult, SuperviseOptions, launch
from commlayer.launch.backend_check import check_backend, chosen_backend, launcher_of
from commlayer.launch.commands import LAUNCHERS
from commlayer.launch.nproc import NPROC_CHOICES, resolve_nproc
from commlayer.launch.report import default_log_dir, final_report, prune_run_logs
from commlayer.launch.restarts import Attempt, restart_line, run_with_restarts

__all__ = ["main"]

# After the first rank fails, how long the others may take to fail by themselves before the
# launcher stops them (a survivor on the dead rank's host sees its process gone at its next
# process check, an announced death within a heartbeat interval); sooner once each has printed its
# exception. A rank busy outside collectives never fails by itself, so it costs this much.
_SETTLE_S = 3.0
_BENCH_MODULE = "commlayer.bench.cli"
_CERTIFY_MODULE = "commlayer.testing.conformance.cli"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``commlayer`` console script and of ``python -m commlayer``."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    bench_cli = None
    if arguments[:1] == ["bench"]:
        bench_cli, bench_problem = _load_bench()
        if bench_cli is None:
            print(f"commlayer bench: the benchmark suite is unavailable: {bench_problem}", file=sys.stderr)
            return 2
    parser = _build_parser(bench_cli)
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exit_request:  # --help or a usage error; report it as a return code
        return _exit_status(exit_request.code)
    if args.command == "run":
        return _run(args)
    if args.command == "backends":
        return _list_backends()
    if args.command == "trace":
        from commlayer import trace_analysis  # reads JSON only; imported on demand

        if args.trace_command == "export":
            return trace_analysis.export(args.directory, args.out)
        return trace_analysis.main(args.directory, with_arrivals=args.arrivals)
    if args.command == "test-backend":
        return int(importlib.import_module(_CERTIFY_MODULE).main(args))
    if args.command == "bench" and bench_cli is not None:
        return int(bench_cli.main(args) or 0)
    parser.print_help(sys.stderr)
    return 2


def _build_parser(bench_cli: ModuleType | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="commlayer", description="commlayer: pluggable communication backends for PyTorch."
    )
    parser.add_argument("--version", action="version", version=f"commlayer {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{run,bench,backends,trace,test-backend}")
    _add_run_arguments(
        commands.add_parser(
            "run", help="launch ranks of a Python script or module, here or across a hostfile's hosts"
        )
    )
    bench = commands.add_parser("bench", help="run the collective benchmarks (commlayer.bench)")
    if bench_cli is not None:  # imported only when `bench` was asked for
        bench_cli.add_arguments(bench)
    commands.add_parser("backends", help="list installed backends and whether each can run here")
    trace = commands.add_parser("trace", help="read flight-recorder dumps (commlayer.trace_analysis)")
    trace_commands = trace.add_subparsers(dest="trace_command", metavar="{analyze,export}", required=True)
    analyze = trace_commands.add_parser(
        "analyze", help="merge every rank's dump of one job and say what happened"
    )
    analyze.add_argument(
        "directory",
        metavar="DIR",
        nargs="?",
        default=None,
        help="a job's folder of rank<N>.json dumps, or a folder of job folders (its newest job); "
        "default: $COMMLAYER_TRACE_DIR, else <tmp>/commlayer-trace",
    )
    analyze.add_argument(
        "--arrivals",
        action="store_true",
        help="also say when each rank entered the collectives: who arrives last, and by how much",
    )
    export = trace_commands.add_parser(
        "export", help="write one job's dumps in torch's flight-recorder format (for torchfrtrace)"
    )
    export.add_argument(
        "--torch", action="store_true", required=True, help="torch's format (the one offered)"
    )
    export.add_argument("directory", metavar="DIR", help="a job's dump folder, or a folder of job folders")
    export.add_argument("out", metavar="OUT", help="folder to write one torch dump per rank into")
    certify = commands.add_parser(
        "test-backend", help="run the conformance suite on a backend and print its certificate"
    )
    _add_certify_arguments(certify)
    return parser


def _add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "-n",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc_per_node",
        type=_nproc,
        default=None,
        metavar="N",
        help=f"ranks to start on this host: a number or one of {'|'.join(NPROC_CHOICES)} as torchrun "
        "(auto: one per GPU, else one per CPU; default 1); with --hostfile, per host (default: its slots)",
    )
    run.add_argument(
        "--backend",
        default=None,
        metavar="NAME",
        help="the backend every rank uses: a name or a device map like cpu:gloo,cuda:nccl (sets "
        "$COMMLAYER_BACKEND); it and $COMMLAYER_BACKEND are checked before any rank starts",
    )
    run.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="treat SCRIPT as a module name and run it like `python -m SCRIPT`",
    )
    run.add_argument(
        "--master-addr",
        "--master_addr",
        dest="master_addr",
        default=None,
        help="address rank 0's store listens on (default 127.0.0.1; with --hostfile, the first host)",
    )
    run.add_argument(
        "--master-port",
        "--master_port",
        dest="master_port",
        type=_port,
        default=None,
        help="port of rank 0's store (default: a free port; with --hostfile, 29500)",
    )
    _add_hosts_arguments(run)
    run.add_argument(
        "--log-dir",
        dest="log_dir",
        type=Path,
        default=None,
        help="write each rank's output to DIR/rankN.log (default: <tmp>/commlayer-run/<job id>)",
    )
    run.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="stop every rank after this many seconds (exit code 124)",
    )
    run.add_argument(
        "--max-restarts",
        "--max_restarts",
        dest="max_restarts",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="when a rank fails, stop every rank and start all of them again, up to N times, as "
        "torchrun (each start sees $TORCHELASTIC_RESTART_COUNT and gets a fresh rendezvous; the "
        "script resumes from its checkpoint; default 0); with --ft, restarts of each member in its "
        "slot (default 3)",
    )
    run.add_argument(
        "--ft",
        action="store_true",
        help="a commlayer.ft job: host its store here, keep the others training when a member dies "
        "and restart that member in its slot (under mpirun: restart the whole job)",
    )
    run.add_argument(
        "--torch-takeover",
        "--torch_takeover",
        dest="torch_takeover",
        action="store_true",
        help="run torch process groups that the script (or its framework) asks for as gloo, nccl or "
        "no backend on commlayer: sets COMMLAYER_TORCH_TAKEOVER=1 for every rank",
    )
    run.add_argument("script", metavar="SCRIPT", help="Python script (or module with -m) every rank runs")
    run.add_argument(
        "script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments passed to SCRIPT"
    )


def _add_hosts_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "--hostfile", type=Path, default=None, help="run across the hosts of FILE ('HOST slots=N' lines)"
    )
    run.add_argument(
        "--include", default=None, metavar="SPEC", help="only these hosts/slots: 'node1:0,1@node2'"
    )
    run.add_argument("--exclude", default=None, metavar="SPEC", help="leave out these hosts/slots: 'node2:3'")
    run.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default=None,
        help="how ranks start on the hosts (default ssh; pdsh, mpirun, srun use those tools); without "
        "--hostfile, mpirun starts this host's ranks (the default where $COMMLAYER_BACKEND is mpi)",
    )
    run.add_argument(
        "--ssh",
        default=None,
        metavar="COMMAND",
        help="remote shell command for ssh/pdsh/mpirun, e.g. 'ssh -F cluster.conf' (default: $COMMLAYER_SSH or ssh)",
    )


def _add_certify_arguments(parser: argparse.ArgumentParser) -> None:
    # Declared here, not in the conformance module, so that building the parser imports no torch.
    parser.add_argument("backend", metavar="NAME", help="an installed backend (see `commlayer backends`)")
    parser.add_argument(
        "-n", "--world-size", dest="world_size", type=_positive_int, default=3, help="ranks (default 3)"
    )
    parser.add_argument(
        "--extensions",
        action="store_true",
        help="also certify hooks, per-call timeouts and one-sided windows",
    )
    parser.add_argument(
        "--launcher",
        choices=("local", "mpirun"),
        default=None,
        help="how ranks start (default: what the backend asks for, else local processes)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        metavar="SECONDS",
        help="stop the world after this long",
    )


def _run(args: argparse.Namespace) -> int:
    program = ("-m", args.script) if args.module else (args.script,)
    choice = chosen_backend(args.backend)
    if choice is not None:
        # Other hosts may differ from this one: there only the name is checked.
        problem = check_backend(*choice, availability=args.hostfile is None)
        if problem is not None:
            print(f"commlayer run: {problem}", file=sys.stderr)
            return 2
        os.environ[settings.BACKEND.name] = choice[0]  # every launch path passes it to the ranks
    if args.torch_takeover:  # every launch path below hands this environment to the ranks
        os.environ[settings.TORCH_TAKEOVER.name] = "1"
    if args.hostfile is not None:
        if args.nproc_per_node is not None and not args.nproc_per_node.isdigit():
            print(
                f"commlayer run: with --hostfile, -n expected a number, received {args.nproc_per_node!r}",
                file=sys.stderr,
            )
            return 2
        args.nproc_per_node = None if args.nproc_per_node is None else int(args.nproc_per_node)
        from commlayer.launch.cli_hosts import run_hosts  # only multi-host runs read hostfiles

        return run_hosts(args, (sys.executable, "-u", *program, *args.script_args))
    stray = [f"--{name}" for name in ("include", "exclude", "ssh") if getattr(args, name) is not None]
    if args.launcher not in (None, "mpirun"):
        stray.append(f"--launcher {args.launcher}")
    if stray:
        print(
            f"commlayer run: {', '.join(stray)} expected together with --hostfile, received without it",
            file=sys.stderr,
        )
        return 2
    try:
        nproc = resolve_nproc(args.nproc_per_node or "1")
    except ValueError as error:
        print(f"commlayer run: {error}", file=sys.stderr)
        return 2
    if (args.launcher or (launcher_of(choice[0]) if choice else "local")) == "mpirun":
        args.nproc_per_node = nproc
        return _run_under_mpirun(args, program)
    if args.ft:
        return _run_ft_here(args, (sys.executable, *program, *args.script_args), nproc)
    return _run_here(args, (sys.executable, *program, *args.script_args), nproc)


def _run_ft_here(args: argparse.Namespace, command: tuple[str, ...], nproc: int) -> int:
    """A fault-tolerant job on this host: members restarted in their slots (launch.fault_tolerance)."""
    from commlayer.launch import fault_tolerance  # hosts a TCPStore: imports torch

    job = os.environ.get(JOB_ID_ENV) or new_job_id()
    log_dir = args.log_dir or default_log_dir(job)
    restarts = fault_tolerance.DEFAULT_MAX_RESTARTS if args.max_restarts is None else args.max_restarts
    options = SuperviseOptions(timeout=args.timeout, log_dir=log_dir)
    environ = {**os.environ, JOB_ID_ENV: job}
    address = args.master_addr or "127.0.0.1"
    result, hosted = fault_tolerance.run_here(
        command, nproc, address, args.master_port, restarts, environ, options
    )
    for line in fault_tolerance.report_lines(result, hosted, log_dir):
        print(line, file=sys.stderr, flush=True)
    return result.exit_code


def _run_here(args: argparse.Namespace, command: tuple[str, ...], nproc: int) -> int:
    """Local ranks, started again from scratch after a rank failure up to ``--max-restarts`` times."""
    job = os.environ.get(JOB_ID_ENV) or new_job_id()

    def start(attempt: Attempt) -> tuple[LaunchResult, Path]:
        log_dir = attempt.log_dir(args.log_dir) or prune_run_logs(default_log_dir(attempt.job_id(job)))
        config = LaunchConfig(
            command=command,
            nproc_per_node=nproc,
            master_addr=args.master_addr or "127.0.0.1",
            master_port=args.master_port,  # None: a fresh free port for every attempt
            env={**os.environ, JOB_ID_ENV: attempt.job_id(job), **attempt.environment()},
            options=SuperviseOptions(
                timeout=attempt.timeout, log_dir=log_dir, hold_tracebacks=True, settle=_SETTLE_S
            ),
        )
        return launch(config), log_dir

    def report(run: tuple[LaunchResult, Path], attempt: Attempt | None = None) -> None:
        result, log_dir = run
        lines = final_report(replace(result, timeout=args.timeout), log_dir)
        for line in [*lines, *([restart_line(result, attempt)] if attempt is not None else [])]:
            print(line, file=sys.stderr, flush=True)

    last = run_with_restarts(start, lambda run: run[0], args.max_restarts or 0, args.timeout, report)
    report(last)
    return last[0].exit_code


def _run_under_mpirun(args: argparse.Namespace, program: tuple[str, ...]) -> int:
    """Start the ranks on this host with the mpirun that matches the MPI library mpi4py loads;
    with --ft, whole-job restarts from the last checkpoint (mpirun ends a job at a death)."""
    from commlayer.launch.mpirun_local import MpirunJob, run_ranks_under_mpirun
    from commlayer.testing.mpi import MpirunError, mpirun_plan

    environ = dict(os.environ)
    # Without MASTER_ADDR the ranks agree on rank 0's store over MPI (commlayer.backends.mpi.discovery).
    if args.master_addr is not None:
        environ["MASTER_ADDR"] = args.master_addr
    if args.master_port is not None:
        environ["MASTER_PORT"] = str(args.master_port)
    hosted = _ft_fallback(args, environ) if args.ft else None
    try:
        plan = mpirun_plan(args.nproc_per_node or 1, environ)
    except MpirunError as problem:
        print(f"commlayer run: the ranks need an MPI launcher: {problem}", file=sys.stderr)
        return 2
    command = (*plan.argv, sys.executable, *program, *args.script_args)
    # Whole lines from every rank (mpirun labels each write): stderr is line-buffered without
    # PYTHONUNBUFFERED, stdout from init on (commlayer.facade.lifecycle.signal_handlers).
    env = {**plan.env, settings.LINE_BUFFERED.name: "1"}
    env.pop("PYTHONUNBUFFERED", None)
    job_id = environ.get(JOB_ID_ENV) or new_job_id()
    job = MpirunJob(command, args.nproc_per_node or 1, env, job_id, args.log_dir)
    code = run_ranks_under_mpirun(job, args.max_restarts or 0, args.timeout)
    del hosted  # the store lived as long as every attempt
    return code


def _ft_fallback(args: argparse.Namespace, environ: dict[str, str]) -> object:
    """--ft under mpirun: say so, default --max-restarts, and host the store every attempt uses."""
    from commlayer.launch import fault_tolerance  # hosts a TCPStore: imports torch

    if args.max_restarts is None:
        args.max_restarts = fault_tolerance.DEFAULT_MAX_RESTARTS
    print(fault_tolerance.mpirun_fallback_line(args.max_restarts), file=sys.stderr, flush=True)
    hosted = fault_tolerance.HostedStore(
        args.master_addr or "127.0.0.1", args.master_port, args.nproc_per_node
    )
    environ.update(hosted.environment())
    return hosted


def _list_backends() -> int:
    from commlayer.contract.registry import list_backends  # imports torch: only this subcommand pays for it

    for info in list_backends():
        status = info.availability
        note = f" ({status.reason})" if status.reason else ""
        detail = f"available{note}" if status else f"unavailable: {status.reason}"
        hint = f" (install: {status.install_hint})" if status.install_hint and not status else ""
        print(f"{info.name:<8} {detail}{hint}    [{info.origin}]")
    return 0


def _load_bench() -> tuple[ModuleType | None, str | None]:
    try:
        return importlib.import_module(_BENCH_MODULE), None
    except ModuleNotFoundError as missing:
        if missing.name in ("commlayer.bench", _BENCH_MODULE):
            return None, f"{_BENCH_MODULE} is not part of this installation"
        return None, f"{_BENCH_MODULE} needs the module {missing.name!r}, which is not installed"


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, received {text!r}")
    return int(text)


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, received {text!r}")
    return int(text)


def _nproc(text: str) -> str:
    if text not in NPROC_CHOICES and not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(
            f"expected an integer >= 1, received {text!r} (or one of {', '.join(NPROC_CHOICES)})"
        )
    return text


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port in 1..65535, received {text!r}")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, received {text!r}")
    return value


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 2
