"""Ways to start one run_world world across the hosts of a :class:`~.cluster.NetworkCluster`.

Each is a :class:`~.harness.WorldLauncher` (``run_world(target, 4, launcher=TorchrunHosts(cluster))``)
placing ``per_host`` consecutive ranks on each host, the way the real launchers do:

* :class:`TorchrunHosts`: one ``torchrun --nnodes K`` agent per host, c10d rendezvous on host 0.
* :class:`SlurmHosts`: every rank started directly with the variables ``srun`` exports
  (SLURM_PROCID, SLURM_NODELIST naming the hosts...), so rendezvous finds host 0 by its name.
* :class:`MpirunHosts`: one ``mpirun`` on host 0 reaching the other hosts through real sshd, with
  the command line ``commlayer run --launcher mpirun`` builds; no MASTER_ADDR unless ``env`` sets
  one, so the ranks exchange rank 0's address over MPI.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from commlayer.launch import ProcessSpec, free_port
from commlayer.launch.commands import JobPlan, mpirun_argv
from commlayer.launch.environment import exported_environment
from commlayer.launch.hostfile import HostSlots
from commlayer.launch.multinode import find_mpirun, mpirun_flavor, search_path
from commlayer.testing.cluster import NetworkCluster
from commlayer.testing.cluster_ssh import SshAccess

__all__ = ["MpirunHosts", "SlurmHosts", "TorchrunHosts"]


@dataclass(frozen=True)
class TorchrunHosts:
    """``torchrun --nnodes K --nproc-per-node per_host`` on every host, c10d rendezvous on host 0.

    torchrun's agent resolves its own hostname to decide who hosts the rendezvous store, which
    fails where names do not resolve; ``--rdzv-conf is_host=`` and ``--local-addr`` say it instead.
    """

    cluster: NetworkCluster
    per_host: int = 2
    name: str = "torchrun across hosts"

    def processes(
        self, command: tuple[str, ...], env: Mapping[str, str], world_size: int
    ) -> list[ProcessSpec]:
        _check_world(self.cluster, self.per_host, world_size)
        endpoint = f"{self.cluster.hosts[0].address}:{free_port()}"
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        specs = []
        for host in self.cluster.hosts:
            argv = [
                torchrun,
                f"--nnodes={len(self.cluster.hosts)}",
                f"--nproc-per-node={self.per_host}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                f"--rdzv-id={self.cluster.tag}",
                f"--rdzv-conf=is_host={int(host.index == 0)}",
                f"--local-addr={host.address}",
                "--max-restarts=0",
                "--no-python",
                *command,
            ]
            specs.append(ProcessSpec(f"{host.name} torchrun", tuple(host.command(argv)), env))
        return specs


@dataclass(frozen=True)
class SlurmHosts:
    """Ranks started as ``srun --ntasks-per-node=per_host`` would, on a cluster whose names resolve."""

    cluster: NetworkCluster
    per_host: int = 2
    name: str = "srun-style across hosts"

    def processes(
        self, command: tuple[str, ...], env: Mapping[str, str], world_size: int
    ) -> list[ProcessSpec]:
        _check_world(self.cluster, self.per_host, world_size)
        hosts = self.cluster.hosts
        shared = {
            "SLURM_NTASKS": str(world_size),
            "SLURM_NODELIST": ",".join(host.name for host in hosts),
            "SLURM_TASKS_PER_NODE": f"{self.per_host}(x{len(hosts)})",
            "SLURM_JOB_ID": self.cluster.tag,
            "MASTER_PORT": str(free_port()),  # sbatch scripts export it; srun does not
        }
        specs = []
        for rank in range(world_size):
            host = hosts[rank // self.per_host]
            own = {
                "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(rank % self.per_host),
                "SLURM_NODEID": str(host.index),
            }
            rank_env = {**env, **shared, **own}
            specs.append(ProcessSpec(f"rank {rank}", tuple(host.command(command)), rank_env))
        return specs


def _check_world(cluster: NetworkCluster, per_host: int, world_size: int) -> None:
    if world_size != per_host * len(cluster.hosts):
        raise ValueError(
            f"run_world: argument 'world_size' expected {per_host} ranks on each of "
            f"{len(cluster.hosts)} hosts = {per_host * len(cluster.hosts)}, received {world_size}"
        )


@dataclass(frozen=True)
class MpirunHosts:
    """``mpirun`` (the venv's, Intel MPI by default; ``COMMLAYER_MPIRUN`` picks another) on host 0."""

    cluster: NetworkCluster
    access: SshAccess
    per_host: int = 2
    name: str = "mpirun across hosts"

    def processes(
        self, command: tuple[str, ...], env: Mapping[str, str], world_size: int
    ) -> list[ProcessSpec]:
        _check_world(self.cluster, self.per_host, world_size)
        hosts = self.cluster.hosts
        plan = JobPlan(
            hosts=tuple(HostSlots(host.address, tuple(range(self.per_host))) for host in hosts),
            program=command,
            master_addr=env.get("MASTER_ADDR"),
            master_port=int(env.get("MASTER_PORT", "0")),
            exported=exported_environment(env, None),
            cwd=str(Path.cwd()),
            ssh=self.access.ssh,
            interface=hosts[0].interface,
        )
        launcher_env = {**env, "PATH": search_path(env)}
        executable = find_mpirun(launcher_env)
        argv = mpirun_argv(plan, mpirun_flavor(executable, launcher_env), executable)
        return [ProcessSpec("mpirun", tuple(hosts[0].command(argv)), launcher_env)]
