"""Find rank, world size and master address in the environment a launcher left behind.

:func:`discover` is a pure function of the mapping it is given, so it is tested without launching
anything. Launchers are tried in a fixed order, the first whose rank variable is present wins:

1. torchrun / ``commlayer run``: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
2. MPI launchers: Open MPI (OMPI_COMM_WORLD_*), MPICH / Intel MPI Hydra (PMI_RANK + MPI_LOCALRANKID),
   plain PMI (PMI_RANK without Hydra's local variables), PMIx (PMIX_RANK).
3. SLURM srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the tasks-per-node lists.

MASTER_ADDR / MASTER_PORT always override. Without them only SLURM yields an address (the first
host of the node list); under MPI launchers ``master_addr`` stays None so that the caller can
exchange it over MPI. When a launcher exports no node-local variables, the whole world is taken to
run on one node (local rank = rank).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RendezvousEnvError", "RendezvousInfo", "discover", "expand_slurm_nodelist"]  # noqa: F822 - see __getattr__

_DIGITS = re.compile(r"\d+")
_TASKS_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
_TASKS_PER_NODE_VARIABLES = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


@dataclass(frozen=True)
class RendezvousInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None
    master_port: int | None
    source: str  # "torchrun" | "openmpi" | "mpich" | "intel-mpi" | "pmi" | "pmix" | "slurm"


def __getattr__(name: str) -> Any:
    # RendezvousEnvError is a torch DistError, defined beside commlayer's other errors; this module
    # stays free of torch, which torch's own import runs (commlayer.facade.torch_bridge.autoload).
    if name == "RendezvousEnvError":
        from commlayer.core.errors import RendezvousEnvError

        return RendezvousEnvError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _env_error(variable: str, expected: str, received: str | None) -> Exception:
    from commlayer.core.errors import RendezvousEnvError

    return RendezvousEnvError(variable, expected, received)


@dataclass(frozen=True)
class _Counts:
    """Rank numbers plus the variable names they came from, for error messages."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    names: tuple[str, str, str, str]  # rank, world size, local rank, local world size


def discover(environ: Mapping[str, str]) -> RendezvousInfo | None:
    """Return the rendezvous of the launcher that started this process, or None outside any launcher.

    >>> discover({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
    ...           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    RendezvousInfo(rank=1, world_size=4, local_rank=1, local_world_size=2, master_addr=None, master_port=None, source='openmpi')
    """
    source = _launcher(environ)
    if source is None:
        return None
    counts = _COUNT_READERS[source](environ)
    _check_consistent(counts)
    return RendezvousInfo(
        rank=counts.rank,
        world_size=counts.world_size,
        local_rank=counts.local_rank,
        local_world_size=counts.local_world_size,
        master_addr=_master_addr(environ, source),
        master_port=_master_port(environ),
        source=source,
    )


def _launcher(environ: Mapping[str, str]) -> str | None:
    if "RANK" in environ or "WORLD_SIZE" in environ:
        return "torchrun"
    if "OMPI_COMM_WORLD_RANK" in environ:
        return "openmpi"
    if "PMI_RANK" in environ:
        if "MPI_LOCALRANKID" not in environ:
            return "pmi"
        # Intel MPI's Hydra exports its I_MPI_* settings to every rank; MPICH's Hydra does not.
        return "intel-mpi" if any(name.startswith("I_MPI_") for name in environ) else "mpich"
    if "PMIX_RANK" in environ:
        return "pmix"
    if "SLURM_PROCID" in environ:
        return "slurm"
    return None


def _torchrun_counts(environ: Mapping[str, str]) -> _Counts:
    rank = _required_int(environ, "RANK", minimum=0, because="WORLD_SIZE is set")
    world_size = _required_int(environ, "WORLD_SIZE", minimum=1, because="RANK is set")
    local_rank = _optional_int(environ, "LOCAL_RANK", minimum=0)
    local_world_size = _optional_int(environ, "LOCAL_WORLD_SIZE", minimum=1)
    return _Counts(
        rank,
        world_size,
        rank if local_rank is None else local_rank,
        world_size if local_world_size is None else local_world_size,
        ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    )


def _openmpi_counts(environ: Mapping[str, str]) -> _Counts:
    names = (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    )
    return _counts_from_names(environ, names, because="OMPI_COMM_WORLD_RANK is set")


def _hydra_counts(environ: Mapping[str, str]) -> _Counts:
    names = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    return _counts_from_names(environ, names, because="Hydra's PMI_RANK and MPI_LOCALRANKID are set")


def _pmi_counts(environ: Mapping[str, str]) -> _Counts:
    rank = _required_int(environ, "PMI_RANK", minimum=0, because="PMI_RANK is set")
    world_size = _required_int(environ, "PMI_SIZE", minimum=1, because="PMI_RANK is set")
    return _with_local_counts(
        environ, rank, world_size, ("PMI_RANK", "PMI_SIZE"), ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE")
    )


def _pmix_counts(environ: Mapping[str, str]) -> _Counts:
    rank = _required_int(environ, "PMIX_RANK", minimum=0, because="PMIX_RANK is set")
    # PMIx publishes the job size only through its API; srun also exports it as SLURM_NTASKS.
    size_name = next(
        (name for name in ("PMI_SIZE", "SLURM_NTASKS", "SLURM_NPROCS") if name in environ), "SLURM_NTASKS"
    )
    world_size = _required_int(
        environ, size_name, minimum=1, because="PMIX_RANK is set and PMIx exports no size"
    )
    return _with_local_counts(environ, rank, world_size, ("PMIX_RANK", size_name), ())


def _slurm_counts(environ: Mapping[str, str]) -> _Counts:
    size_name = (
        "SLURM_NTASKS" if "SLURM_NTASKS" in environ or "SLURM_NPROCS" not in environ else "SLURM_NPROCS"
    )
    rank = _required_int(environ, "SLURM_PROCID", minimum=0, because="SLURM_PROCID is set")
    world_size = _required_int(environ, size_name, minimum=1, because="SLURM_PROCID is set")
    return _with_local_counts(environ, rank, world_size, ("SLURM_PROCID", size_name), ())


_COUNT_READERS = {
    "torchrun": _torchrun_counts,
    "openmpi": _openmpi_counts,
    "mpich": _hydra_counts,
    "intel-mpi": _hydra_counts,
    "pmi": _pmi_counts,
    "pmix": _pmix_counts,
    "slurm": _slurm_counts,
}


def _counts_from_names(environ: Mapping[str, str], names: tuple[str, str, str, str], because: str) -> _Counts:
    rank_name, size_name, local_rank_name, local_size_name = names
    return _Counts(
        _required_int(environ, rank_name, minimum=0, because=because),
        _required_int(environ, size_name, minimum=1, because=because),
        _required_int(environ, local_rank_name, minimum=0, because=because),
        _required_int(environ, local_size_name, minimum=1, because=because),
        names,
    )


def _with_local_counts(
    environ: Mapping[str, str], rank: int, world_size: int, names: tuple[str, str], own_local: tuple[str, ...]
) -> _Counts:
    """Local rank/size from the launcher's own variables, else from srun's, else one node."""
    if own_local and own_local[0] in environ:
        local_rank = _required_int(environ, own_local[0], minimum=0, because=f"{names[0]} is set")
        local_size = _required_int(environ, own_local[1], minimum=1, because=f"{own_local[0]} is set")
        return _Counts(rank, world_size, local_rank, local_size, (*names, *own_local))
    if "SLURM_LOCALID" in environ:
        local_rank = _required_int(environ, "SLURM_LOCALID", minimum=0, because="SLURM_LOCALID is set")
        local_size, local_size_name = _slurm_local_world_size(environ)
        return _Counts(rank, world_size, local_rank, local_size, (*names, "SLURM_LOCALID", local_size_name))
    return _Counts(rank, world_size, rank, world_size, (*names, names[0], names[1]))


def _slurm_local_world_size(environ: Mapping[str, str]) -> tuple[int, str]:
    """This node's task count: the entry of the first tasks-per-node list for SLURM_NODEID."""
    name = next((candidate for candidate in _TASKS_PER_NODE_VARIABLES if candidate in environ), None)
    if name is None:
        raise _env_error(
            "SLURM_TASKS_PER_NODE",
            "a tasks-per-node list such as '4' or '2(x3),1' (SLURM_LOCALID is set)",
            None,
        )
    counts = _expand_tasks_per_node(environ[name], name)
    if "SLURM_NODEID" not in environ:
        if len(set(counts)) == 1:
            return counts[0], name
        raise _env_error(
            "SLURM_NODEID", f"this node's index, to pick an entry of {name}={environ[name]!r}", None
        )
    node = _required_int(environ, "SLURM_NODEID", minimum=0, because="SLURM_LOCALID is set")
    if node >= len(counts):
        raise _env_error(
            "SLURM_NODEID",
            f"a node index below {len(counts)}, the number of nodes in {name}={environ[name]!r}",
            str(node),
        )
    return counts[node], name


def _expand_tasks_per_node(value: str, variable: str) -> list[int]:
    """``'2(x3),1'`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS_ITEM.fullmatch(item)
        if (
            match is None
            or int(match.group(1)) < 1
            or (match.group(2) is not None and int(match.group(2)) < 1)
        ):
            raise _env_error(variable, "a comma list of task counts like '4' or '2(x3),1'", value)
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _check_consistent(counts: _Counts) -> None:
    rank_name, size_name, local_rank_name, local_size_name = counts.names
    if counts.rank >= counts.world_size:
        raise _env_error(rank_name, f"a rank below {size_name}={counts.world_size}", str(counts.rank))
    if counts.local_world_size > counts.world_size:
        raise _env_error(
            local_size_name, f"at most {size_name}={counts.world_size}", str(counts.local_world_size)
        )
    if counts.local_rank >= counts.local_world_size:
        raise _env_error(
            local_rank_name,
            f"a local rank below {local_size_name}={counts.local_world_size}",
            str(counts.local_rank),
        )


def _master_addr(environ: Mapping[str, str], source: str) -> str | None:
    if "MASTER_ADDR" in environ:
        address = environ["MASTER_ADDR"]
        if not address or any(character.isspace() for character in address):
            raise _env_error("MASTER_ADDR", "a host name or IP address", address)
        return address
    if source != "slurm":
        return None
    name = next((candidate for candidate in _NODELIST_VARIABLES if candidate in environ), None)
    return None if name is None else expand_slurm_nodelist(environ[name], variable=name)[0]


def _master_port(environ: Mapping[str, str]) -> int | None:
    port = _optional_int(environ, "MASTER_PORT", minimum=1)
    if port is not None and port > 65535:
        raise _env_error("MASTER_PORT", "a TCP port between 1 and 65535", environ["MASTER_PORT"])
    return port


def _required_int(environ: Mapping[str, str], name: str, minimum: int, because: str) -> int:
    value = _optional_int(environ, name, minimum)
    if value is None:
        raise _env_error(name, f"{_int_kind(minimum)} because {because}", None)
    return value


def _optional_int(environ: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = environ.get(name)
    if raw is None:
        return None
    if _DIGITS.fullmatch(raw) is None or int(raw) < minimum:
        raise _env_error(name, _int_kind(minimum), raw)
    return int(raw)


def _int_kind(minimum: int) -> str:
    return "a non-negative integer" if minimum == 0 else f"an integer >= {minimum}"


def expand_slurm_nodelist(nodelist: str, *, variable: str = "SLURM_NODELIST") -> list[str]:
    """Expand SLURM's compressed host list, keeping zero padding and the order given.

    >>> expand_slurm_nodelist("node[01-03,07],gpu[1-2]x,login")
    ['node01', 'node02', 'node03', 'node07', 'gpu1x', 'gpu2x', 'login']
    >>> expand_slurm_nodelist("rack[1-2]-n[8-9]")
    ['rack1-n8', 'rack1-n9', 'rack2-n8', 'rack2-n9']
    """
    return [
        host
        for pattern in _split_top_level(nodelist, variable)
        for host in _expand_pattern(pattern, nodelist, variable)
    ]


def _split_top_level(nodelist: str, variable: str) -> list[str]:
    """Split on commas outside brackets; reject unbalanced or nested brackets."""
    patterns, current, inside = [], [], False
    for character in nodelist:
        if character == "[":
            if inside:
                raise _env_error(variable, "a host list without nested '[' brackets", nodelist)
            inside = True
        elif character == "]":
            if not inside:
                raise _env_error(variable, "a host list whose ']' closes an open '['", nodelist)
            inside = False
        if character == "," and not inside:
            patterns.append("".join(current))
            current = []
        else:
            current.append(character)
    if inside:
        raise _env_error(variable, "a host list whose '[' brackets are all closed", nodelist)
    patterns.append("".join(current))
    if any(not pattern for pattern in patterns):
        raise _env_error(variable, "a non-empty comma list of host names", nodelist)
    return patterns


def _expand_pattern(pattern: str, nodelist: str, variable: str) -> list[str]:
    """``'a[1-2]b[5,7]'`` -> ``['a1b5', 'a1b7', 'a2b5', 'a2b7']`` (the last bracket varies fastest)."""
    pieces = re.split(r"\[([^\]]*)\]", pattern)
    # re.split with one group alternates literal text and bracket contents.
    choices = [
        [piece] if index % 2 == 0 else _expand_bracket(piece, nodelist, variable)
        for index, piece in enumerate(pieces)
    ]
    return ["".join(parts) for parts in itertools.product(*choices)]


def _expand_bracket(body: str, nodelist: str, variable: str) -> list[str]:
    numbers: list[str] = []
    for item in body.split(","):
        start, _, end = item.partition("-")
        end = end if "-" in item else start
        if _DIGITS.fullmatch(start) is None or _DIGITS.fullmatch(end) is None or int(end) < int(start):
            raise _env_error(variable, f"bracket ranges like 'node[01-04,07]', not '[{body}]'", nodelist)
        numbers.extend(str(number).zfill(len(start)) for number in range(int(start), int(end) + 1))
    return numbers
