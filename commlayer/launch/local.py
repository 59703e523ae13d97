"""``commlayer run -n N``: N ranks of one world on this host, with torchrun's variables.

Layout for ``launch(LaunchConfig(command=("python", "train.py"), nproc_per_node=3))``::

    rank 0: RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 LOCAL_WORLD_SIZE=3   output lines "[rank0] ..."
    rank 1: RANK=1 WORLD_SIZE=3 LOCAL_RANK=1 LOCAL_WORLD_SIZE=3   output lines "[rank1] ..."
    rank 2: RANK=2 WORLD_SIZE=3 LOCAL_RANK=2 LOCAL_WORLD_SIZE=3   output lines "[rank2] ..."
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from commlayer.core.ports import free_port
from commlayer.launch.supervise import LaunchResult, ProcessSpec, SuperviseOptions, supervise

__all__ = ["LaunchConfig", "RankPlace", "free_port", "launch", "rank_environment"]


@dataclass(frozen=True)
class LaunchConfig:
    """One ``commlayer run``: ``command`` runs once per rank, all on this host."""

    command: tuple[str, ...]
    nproc_per_node: int
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # None: pick a free port
    env: Mapping[str, str] | None = None  # base environment of every rank; None: this process's
    options: SuperviseOptions = SuperviseOptions()  # noqa: RUF009 - frozen, so safe to share

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError(
                "LaunchConfig: argument 'command' expected a non-empty program and arguments, received ()"
            )
        if self.nproc_per_node < 1:
            raise ValueError(
                f"LaunchConfig: argument 'nproc_per_node' expected an integer >= 1, received {self.nproc_per_node}"
            )
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise ValueError(
                f"LaunchConfig: argument 'master_port' expected a port in 1..65535, received {self.master_port}"
            )


@dataclass(frozen=True)
class RankPlace:
    """Where one rank sits: in the world, on its host, and which host of how many."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int = 0
    nnodes: int = 1


def launch(config: LaunchConfig) -> LaunchResult:
    """Run ``config.command`` as ranks 0..N-1 of one world on this host and wait for all of them."""
    port = config.master_port if config.master_port is not None else free_port()
    base = dict(os.environ if config.env is None else config.env)
    size = config.nproc_per_node
    specs = [
        ProcessSpec(
            f"rank {rank}",
            config.command,
            rank_environment(base, RankPlace(rank, size, rank, size), config.master_addr, port),
        )
        for rank in range(size)
    ]
    return supervise(specs, config.options)


def rank_environment(
    base: Mapping[str, str], place: RankPlace, master_addr: str, port: int
) -> dict[str, str]:
    """``base`` plus torchrun's variables for ``place`` (GROUP_RANK is torchrun's node rank)."""
    multinode = (
        {
            "GROUP_RANK": str(place.node_rank),
            "NODE_RANK": str(place.node_rank),
            "GROUP_WORLD_SIZE": str(place.nnodes),
        }
        if place.nnodes > 1
        else {}
    )
    return {
        **base,
        "RANK": str(place.rank),
        "WORLD_SIZE": str(place.world_size),
        "LOCAL_RANK": str(place.local_rank),
        "LOCAL_WORLD_SIZE": str(place.local_world_size),
        **multinode,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(port),
        "PYTHONUNBUFFERED": "1",  # rank output should interleave in the order it happened
    }
