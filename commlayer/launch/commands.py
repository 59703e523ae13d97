"""Command lines that start a multi-host job through ssh, pdsh, mpirun or srun.

For ``ssh`` and ``pdsh`` every host runs the commlayer agent (:mod:`commlayer.launch.agent`),
which starts that host's ranks; ``mpirun`` and ``srun`` start the ranks themselves and commlayer's
rendezvous reads their variables. Layout ``node1 slots=2``, ``node2 slots=2``, ``train.py``::

    ssh  node1 'cd /job && exec env MASTER_ADDR=node1 ... python -u -m commlayer.launch.agent
                --hosts node1:0,1@node2:0,1 --node-rank 0 --master-port 29500 --watch-stdin -- python -u train.py'
    pdsh -S -f 1024 -w node1,node2 'cd /job && exec env ... agent ... --node-rank %n -- ...'
    mpirun -n 4 --host node1:2,node2:2 -x MASTER_ADDR ... python -u train.py      (Open MPI)
    mpiexec.hydra -n 4 -hosts node1:2,node2:2 -genv MASTER_ADDR node1 ... python -u train.py
    srun --nodes=2 --ntasks=4 --ntasks-per-node=2 --nodelist=node1,node2 --export=ALL,... python -u train.py
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from commlayer.launch.hostfile import HostSlots
from commlayer.launch.slot_keeper import keeper_command

__all__ = [
    "LAUNCHERS",
    "JobPlan",
    "agent_argv",
    "mpirun_argv",
    "pdsh_argv",
    "remote_line",
    "srun_argv",
    "ssh_argv",
]

LAUNCHERS = ("ssh", "pdsh", "mpirun", "srun")


@dataclass(frozen=True)
class JobPlan:
    """One multi-host job: where its ranks go and what each host runs."""

    hosts: tuple[HostSlots, ...]
    program: tuple[str, ...]  # the rank program, e.g. (python, -u, train.py, --lr, 1)
    master_addr: str | None  # None: not exported (MPI ranks then exchange rank 0's address over MPI)
    master_port: int
    exported: Mapping[str, str] = field(default_factory=dict)  # sent to every rank
    cwd: str = "."
    ssh: tuple[str, ...] = ("ssh",)  # the remote shell, e.g. ("ssh", "-F", "cluster.conf")
    python: str = sys.executable  # the same path on every host (a shared filesystem or image)
    interface: str | None = None  # the network interface MPI's launcher and transport should use
    ft_max_restarts: int | None = None  # a commlayer.ft job: each member restarted in its slot

    @property
    def world_size(self) -> int:
        return sum(len(entry.slots) for entry in self.hosts)

    def hosts_spec(self) -> str:
        """The layout in ``--include`` syntax, which the agent reads back."""
        return "@".join(f"{entry.host}:{','.join(map(str, entry.slots))}" for entry in self.hosts)

    def rank_variables(self) -> dict[str, str]:
        if self.master_addr is None:
            return dict(self.exported)
        return {**self.exported, "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}


def agent_argv(plan: JobPlan, node_rank: str, watch_stdin: bool) -> list[str]:
    watch = ["--watch-stdin"] if watch_stdin else []
    ft = [] if plan.ft_max_restarts is None else [f"--ft-max-restarts={plan.ft_max_restarts}"]
    return [
        plan.python,
        "-u",
        "-m",
        "commlayer.launch.agent",
        f"--hosts={plan.hosts_spec()}",
        f"--node-rank={node_rank}",
        *watch,
        *ft,
        "--",
        *plan.program,
    ]


def remote_line(plan: JobPlan, argv: list[str]) -> str:
    """A POSIX shell line that enters the job's directory and runs ``argv`` with the job's variables."""
    variables = [f"{name}={value}" for name, value in sorted(plan.rank_variables().items())]
    return f"cd {shlex.quote(plan.cwd)} && exec env {shlex.join(variables)} {shlex.join(argv)}"


def ssh_argv(plan: JobPlan, node_rank: int) -> list[str]:
    """One ssh per host; its stdin stays open so that closing it (or a signal line) reaches the agent."""
    line = remote_line(plan, agent_argv(plan, str(node_rank), watch_stdin=True))
    return [*plan.ssh, "-o", "BatchMode=yes", plan.hosts[node_rank].host, line]


def pdsh_argv(plan: JobPlan) -> tuple[list[str], dict[str, str]]:
    """One pdsh for every host (``%n`` is pdsh's index of the host); returns argv and its extra variables."""
    line = remote_line(plan, agent_argv(plan, "%n", watch_stdin=False))
    hosts = ",".join(entry.host for entry in plan.hosts)
    # pdsh's ssh module runs plain `ssh`; options travel in PDSH_SSH_ARGS_APPEND.
    extra = {
        "PDSH_RCMD_TYPE": "ssh",
        "PDSH_SSH_ARGS_APPEND": shlex.join([*plan.ssh[1:], "-o", "BatchMode=yes"]),
    }
    return ["pdsh", "-S", "-f", "1024", "-w", hosts, line], extra


def mpirun_argv(plan: JobPlan, flavor: str, launcher: str) -> list[str]:
    """``launcher`` (an mpirun of ``flavor`` "openmpi" or a Hydra one) starting the ranks directly."""
    hosts = ",".join(f"{entry.host}:{len(entry.slots)}" for entry in plan.hosts)
    variables = plan.rank_variables()
    if flavor == "openmpi":
        exports = [item for name in sorted(variables) for item in ("-x", f"{name}={variables[name]}")]
        agent = ["--mca", "plm_rsh_agent", shlex.join(plan.ssh)]
        if plan.interface is not None:
            agent += [
                "--mca",
                "oob_tcp_if_include",
                plan.interface,
                "--mca",
                "btl_tcp_if_include",
                plan.interface,
            ]
        placement = ["--host", hosts, "--oversubscribe", "--bind-to", "none", "--tag-output"]
        return [
            launcher,
            "-n",
            str(plan.world_size),
            *placement,
            *agent,
            *exports,
            "--wdir",
            plan.cwd,
            *plan.program,
        ]
    exports = [item for name in sorted(variables) for item in ("-genv", name, variables[name])]
    agent = ["-launcher", "ssh", "-launcher-exec", plan.ssh[0]]
    agent += ["-bootstrap-exec-args", shlex.join(plan.ssh[1:])] if len(plan.ssh) > 1 else []
    # Hydra's proxies call back to the launching host by name unless told its interface.
    agent += ["-iface", plan.interface] if plan.interface is not None else []
    return [
        launcher,
        "-n",
        str(plan.world_size),
        "-hosts",
        hosts,
        "-l",
        *agent,
        *exports,
        "-wdir",
        plan.cwd,
        *plan.program,
    ]


def srun_argv(plan: JobPlan) -> list[str]:
    """srun places the same number of ranks on every node; uneven slot filters are refused."""
    counts = {len(entry.slots) for entry in plan.hosts}
    if len(counts) != 1:
        raise ValueError(
            f"commlayer run: --launcher srun expected the same number of ranks on every host, received {plan.hosts_spec()}"
        )
    exports = ",".join(["ALL", *(f"{name}={value}" for name, value in sorted(plan.rank_variables().items()))])
    program, ft = plan.program, ()
    if plan.ft_max_restarts is not None:  # each task keeps its member; a lost node stops no other task
        program, ft = keeper_command(plan.program, plan.ft_max_restarts), ("--no-kill",)
    return [
        "srun",
        f"--nodes={len(plan.hosts)}",
        f"--ntasks={plan.world_size}",
        f"--ntasks-per-node={counts.pop()}",
        f"--nodelist={','.join(entry.host for entry in plan.hosts)}",
        f"--chdir={plan.cwd}",
        f"--export={exports}",
        "--label",
        "--kill-on-bad-exit=1",
        *ft,
        *program,
    ]
