"""``python -m commlayer.launch.agent``: start one host's ranks of a ``commlayer run --hostfile`` job.

``commlayer run`` starts one agent per host (through ssh or pdsh) with the job's layout and the
host's index; the agent gives each of its ranks torchrun's variables and supervises them like a
local ``commlayer run``: output prefixed ``[host rankN]``, the first failing rank stops the others,
and the exit status is that rank's. On failure its last stderr line names the rank and the time,
``commlayer run on node2: rank 3 on node2 was killed by SIGKILL (exit code 137); ... [at 1764150000.123]``,
from which the launcher picks the job's first failure across hosts.

The ranks stop when the launcher goes away: ``--watch-stdin`` (ssh) reads the launcher's stdin,
where a line ``SIGINT`` / ``SIGTERM`` / ``SIGUSR1`` is a forwarded signal and end-of-file a lost launcher; without
it (pdsh), the launcher's session ending re-parents the agent, which is noticed the same way.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from commlayer.launch.hostfile import HostSlots, parse_filter
from commlayer.launch.local import RankPlace, rank_environment
from commlayer.launch.slot_keeper import keeper_command
from commlayer.launch.supervise import LaunchResult, ProcessSpec, SuperviseOptions, supervise

__all__ = ["main", "rank_specs"]

_KILL_GRACE_SECONDS = 5.0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    hosts = [HostSlots(host, slots or (0,)) for host, slots in parse_filter(args.hosts, "--hosts").items()]
    if not 0 <= args.node_rank < len(hosts):
        print(
            f"commlayer agent: argument '--node-rank' expected 0..{len(hosts) - 1}, received {args.node_rank}",
            file=sys.stderr,
        )
        return 2
    watch = _LauncherWatch(args.watch_stdin)
    options = SuperviseOptions(kill_grace=_KILL_GRACE_SECONDS, stop_check=watch)
    specs = rank_specs(hosts, args.node_rank, tuple(args.program), dict(os.environ), args.ft_max_restarts)
    result = supervise(specs, options)
    _report(result, hosts[args.node_rank].host)
    return result.exit_code


def rank_specs(
    hosts: list[HostSlots],
    node_rank: int,
    program: tuple[str, ...],
    base: dict[str, str],
    ft_max_restarts: int | None = None,
) -> list[ProcessSpec]:
    """This host's ranks: consecutive world ranks after those of the hosts before it; with
    ``ft_max_restarts``, each under a slot keeper (:mod:`.slot_keeper`)."""
    node = hosts[node_rank]
    first = sum(len(entry.slots) for entry in hosts[:node_rank])
    world = sum(len(entry.slots) for entry in hosts)
    master_addr = base.get("MASTER_ADDR", hosts[0].host)
    port = int(base.get("MASTER_PORT", "29500"))
    if node.slots != tuple(range(len(node.slots))) and "CUDA_VISIBLE_DEVICES" not in base:
        base = {**base, "CUDA_VISIBLE_DEVICES": ",".join(map(str, node.slots))}  # the slots --include kept
    specs = []
    for local_rank in range(len(node.slots)):
        place = RankPlace(first + local_rank, world, local_rank, len(node.slots), node_rank, len(hosts))
        label = f"rank {place.rank} on {node.host}"
        env = rank_environment(base, place, master_addr, port)
        argv = program if ft_max_restarts is None else keeper_command(program, ft_max_restarts, label)
        specs.append(ProcessSpec(label, argv, env, tag=f"[{node.host} rank{place.rank}] "))
    return specs


class _LauncherWatch:
    """stop_check: the launcher closed our stdin or its session ended (we were re-parented)."""

    def __init__(self, watch_stdin: bool) -> None:
        self.parent = os.getppid()
        self.closed = threading.Event()
        if watch_stdin:
            threading.Thread(target=self._read_stdin, name="commlayer-agent-stdin", daemon=True).start()

    def __call__(self) -> str | None:
        if self.closed.is_set() or os.getppid() != self.parent:
            return "the connection to commlayer run closed"
        return None

    def _read_stdin(self) -> None:
        # Raw reads: a daemon thread blocked in sys.stdin's buffered reader aborts interpreter exit.
        pending = b""
        while chunk := _read_fd(0):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                name = line.strip().decode("ascii", errors="replace")
                if name in ("SIGINT", "SIGTERM", "SIGUSR1"):
                    os.kill(os.getpid(), signal.Signals[name])  # the supervisor forwards it to every rank
        self.closed.set()


def _read_fd(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:
        return b""


def _report(result: LaunchResult, host: str) -> None:
    summary = result.summary(prefix=f"commlayer run on {host}")
    if summary is None:
        return
    with_time = f"{summary} [at {result.ended_at:.6f}]" if result.first_failure is not None else summary
    try:
        print(with_time, file=sys.stderr, flush=True)
    except OSError:
        pass  # the launcher's connection is gone; the exit status is all that is left


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m commlayer.launch.agent")
    parser.add_argument("--hosts", required=True, help="the job's layout: host:slot,slot@host:slot...")
    parser.add_argument("--node-rank", type=int, required=True, help="this host's index in --hosts")
    parser.add_argument(
        "--watch-stdin", action="store_true", help="stdin carries signals; EOF stops the ranks"
    )
    parser.add_argument(
        "--ft-max-restarts", type=int, default=None, help="a commlayer.ft job: restart each rank in place"
    )
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS: what every rank runs")
    args = parser.parse_args(argv)
    args.program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not args.program:
        parser.error("expected '-- PROGRAM [ARGS]' after the options")
    return args


if __name__ == "__main__":
    raise SystemExit(main())
