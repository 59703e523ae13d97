"""``commlayer run --hostfile``: from parsed arguments to a :class:`~.commands.JobPlan` and its run."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from commlayer.core import settings
from commlayer.core.job import new_job_id
from commlayer.core.netif import route_interface, route_source
from commlayer.launch.commands import JobPlan
from commlayer.launch.environment import exported_environment, find_env_file
from commlayer.launch.hostfile import HostfileError, HostSlots, read_hostfile, select_hosts
from commlayer.launch.multinode import HostsRun, run_across_hosts
from commlayer.launch.report import default_log_dir
from commlayer.launch.restarts import Attempt, restart_line, run_with_restarts
from commlayer.launch.supervise import SuperviseOptions

__all__ = ["job_plan", "run_hosts"]

DEFAULT_MASTER_PORT = 29500
_SSH_LOST = 255  # ssh's status when the connection to the host broke
SSH_ENV = settings.SSH.name


def run_hosts(args: argparse.Namespace, program: tuple[str, ...]) -> int:
    """Run ``program`` on every selected host; print the first failure; return the job's exit status."""
    try:
        plan = job_plan(args, program)
    except (HostfileError, ValueError) as problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        outcome = _run_ft(plan, args) if args.ft else _run_with_restarts(plan, args)
    except ValueError as problem:
        print(problem, file=sys.stderr)
        return 2
    except FileNotFoundError as missing:
        print(
            f"commlayer run: --launcher {args.launcher or 'ssh'} needs {missing.filename!r}, which is not installed",
            file=sys.stderr,
        )
        return 127
    if outcome.summary is not None:
        print(outcome.summary, file=sys.stderr, flush=True)
    return outcome.exit_code


def _run_with_restarts(plan: JobPlan, args: argparse.Namespace) -> HostsRun:
    """Every host's ranks, all started again after a rank failure up to ``--max-restarts`` times."""

    def start(attempt: Attempt) -> HostsRun:
        exported = {**plan.exported, **attempt.environment()}
        options = SuperviseOptions(timeout=attempt.timeout, log_dir=attempt.log_dir(args.log_dir))
        outcome = run_across_hosts(
            replace(plan, exported=exported), args.launcher or "ssh", options, os.environ
        )
        return with_job_limit(outcome, args.timeout)

    def report(outcome: HostsRun, attempt: Attempt) -> None:
        print(outcome.summary, file=sys.stderr, flush=True)
        print(restart_line(outcome.result, attempt), file=sys.stderr, flush=True)

    return run_with_restarts(
        start, lambda outcome: outcome.result, args.max_restarts or 0, args.timeout, report
    )


def _run_ft(plan: JobPlan, args: argparse.Namespace) -> HostsRun:
    """A commlayer.ft job across the hosts: this process hosts its store; each host's agent (or
    srun task) restarts its members in place, and a lost host stops no other host. Under mpirun,
    whole-job restarts instead (launch.fault_tolerance)."""
    from commlayer.launch import fault_tolerance  # hosts a TCPStore: imports torch

    restarts = fault_tolerance.DEFAULT_MAX_RESTARTS if args.max_restarts is None else args.max_restarts
    address = args.master_addr or _address_seen_by(plan.hosts)
    hosted = fault_tolerance.HostedStore(address, args.master_port, plan.world_size)
    variables = {**plan.exported, **hosted.environment()}
    plan = replace(plan, master_addr=address, master_port=hosted.port, exported=variables)
    launcher = args.launcher or "ssh"
    if launcher == "mpirun":
        print(fault_tolerance.mpirun_fallback_line(restarts), file=sys.stderr, flush=True)
        args.max_restarts = restarts
        return _run_with_restarts(plan, args)
    # A host that stops answering ends its ssh within seconds (exit status 255): a lost host.
    alive = ("-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3")
    plan = replace(plan, ft_max_restarts=restarts, ssh=(*plan.ssh, *alive))
    log_dir = args.log_dir or default_log_dir(new_job_id())
    options = SuperviseOptions(
        timeout=args.timeout,
        log_dir=log_dir,
        kill_grace=fault_tolerance.KILL_GRACE_S,
        stop_check=hosted.failure_check(),
        tolerated=(lambda _index, code: code == _SSH_LOST) if launcher == "ssh" else None,
    )
    outcome = run_across_hosts(plan, launcher, options, os.environ)
    lines = fault_tolerance.report_lines(outcome.result, hosted, log_dir)
    lost = [o.label for o in outcome.result.outcomes if o.exit_code == _SSH_LOST and launcher == "ssh"]
    lines += [f"commlayer run --ft: lost {label}: its members did not come back" for label in lost]
    return replace(outcome, summary="\n".join(lines) or None, exit_code=outcome.result.exit_code)


def _address_seen_by(hosts: tuple[HostSlots, ...]) -> str:
    """This machine's address as the first remote host reaches it (loopback for a local job)."""
    for entry in hosts:
        source = route_source(entry.host)
        if source is not None and not source.startswith("127."):
            return source
    return "127.0.0.1"


def with_job_limit(outcome: HostsRun, timeout: float | None) -> HostsRun:
    """``outcome`` whose timeout summary names the job's ``--timeout``: an attempt after a restart
    runs for only what is left of it."""
    if not outcome.result.timed_out or outcome.summary != outcome.result.summary():
        return outcome
    return replace(outcome, summary=replace(outcome.result, timeout=timeout).summary())


def job_plan(args: argparse.Namespace, program: tuple[str, ...]) -> JobPlan:
    hosts = select_hosts(read_hostfile(args.hostfile), args.include, args.exclude)
    if args.nproc_per_node is not None:
        hosts = [_first_slots(entry, args.nproc_per_node) for entry in hosts]
    ssh = shlex.split(args.ssh or str(settings.SSH.value()))
    master_addr = args.master_addr or hosts[0].host
    return JobPlan(
        hosts=tuple(hosts),
        program=program,
        master_addr=master_addr,
        master_port=args.master_port or DEFAULT_MASTER_PORT,
        exported=exported_environment(os.environ, find_env_file()),
        cwd=str(Path.cwd()),
        ssh=tuple(ssh),
        interface=settings.SOCKET_IFNAME.text() or route_interface(master_addr),
    )


def _first_slots(entry: HostSlots, count: int) -> HostSlots:
    if count > len(entry.slots):
        raise HostfileError(
            f"commlayer run: argument '-n' expected at most the {len(entry.slots)} slots of {entry.host!r}, received {count}"
        )
    return HostSlots(entry.host, entry.slots[:count])
