"""Names of ``torch.distributed`` that are torch's own, re-exported with torch's meaning.

Stores, option structs, the error hierarchy, the debug-level API, DDP's building blocks and the
launcher helpers do not dispatch to a backend, so ``commlayer.dist.TCPStore`` *is*
``torch.distributed.TCPStore``: code written for torch gets the very same objects. Submodules
(``dist.device_mesh``, ``dist.checkpoint``, ...) resolve lazily through :func:`torch_submodule`,
so importing commlayer does not import torch's RPC or checkpoint stacks.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from torch.distributed import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    Backend,
    BackendConfig,
    BarrierOptions,
    BroadcastOptions,
    BuiltinCommHookType,
    DebugLevel,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    FileStore,
    GatherOptions,
    GradBucket,
    HashStore,
    Logger,
    PrefixStore,
    QueueEmptyError,
    ReduceOptions,
    Reducer,
    ReduceScatterOptions,
    ScatterOptions,
    Store,
    TCPStore,
    default_pg_timeout,
    get_debug_level,
    get_node_local_rank,
    is_torchelastic_launched,
    register_rendezvous_handler,
    rendezvous,
    set_debug_level,
    set_debug_level_from_env,
)
from torch.distributed import DeviceMesh as DeviceMesh  # noqa: PLC0414 - explicit re-export

__all__ = [
    "AllToAllOptions",
    "AllreduceCoalescedOptions",
    "AllreduceOptions",
    "Backend",
    "BackendConfig",
    "BarrierOptions",
    "BroadcastOptions",
    "BuiltinCommHookType",
    "DebugLevel",
    "DeviceMesh",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "FileStore",
    "GatherOptions",
    "GradBucket",
    "HashStore",
    "Logger",
    "PrefixStore",
    "QueueEmptyError",
    "ReduceOptions",
    "ReduceScatterOptions",
    "Reducer",
    "ScatterOptions",
    "Store",
    "TCPStore",
    "default_pg_timeout",
    "get_debug_level",
    "get_node_local_rank",
    "is_torchelastic_launched",
    "register_rendezvous_handler",
    "rendezvous",
    "set_debug_level",
    "set_debug_level_from_env",
    "torch_submodule",
]

#: Optional names torch.distributed has only in some builds or versions: re-exported when present.
OPTIONAL_NAMES = (
    "ProcessGroupGloo",
    "ProcessGroupNCCL",
    "ProcessGroupMPI",
    "GroupName",
    "RankType",
    "config",
    "record_comm",  # torch >= 2.12: names the profiling entries of torch backends' Work
)

#: torch.distributed's public submodules (and those its own ``__init__`` imports eagerly).
SUBMODULES = frozenset(
    {
        "algorithms",
        "autograd",
        "c10d_logger",
        "checkpoint",
        "constants",
        "device_mesh",
        "distributed_c10d",
        "elastic",
        "flight_recorder",
        "fsdp",
        "logging_handlers",
        "nn",
        "optim",
        "pipelining",
        "remote_device",
        "rpc",
        "tensor",
        "utils",
    }
)


def torch_submodule(name: str) -> ModuleType | None:
    """``torch.distributed.<name>`` when ``name`` is one of its submodules, else None."""
    if name not in SUBMODULES:
        return None
    return importlib.import_module(f"torch.distributed.{name}")
