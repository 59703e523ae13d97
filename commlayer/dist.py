"""``from commlayer import dist``: a drop-in for ``import torch.distributed as dist``.

Same functions, arguments and semantics; each call is validated, resolved to its group and handed
to the registered backend serving the tensor's device. Every public name of the installed
``torch.distributed`` is here: what dispatches is implemented over commlayer's groups, what is
torch's own (stores, option structs, errors, ``DeviceMesh``, submodules) is torch's object itself.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch.distributed as _torch_dist

from commlayer.core.types import ReduceOp
from commlayer.core.work import Work
from commlayer.facade.groups.group import GroupMember, ProcessGroup, group
from commlayer.facade.groups.queries import (
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    is_available,
    is_initialized,
)
from commlayer.facade.lifecycle import extensions
from commlayer.facade.lifecycle.process_groups import destroy_process_group, init_process_group, new_group
from commlayer.facade.lifecycle.shrink import shrink_group
from commlayer.facade.lifecycle.subgroups import (
    get_backend_config,
    get_default_backend_for_device,
    get_pg_count,
    is_backend_available,
    is_gloo_available,
    is_mpi_available,
    is_nccl_available,
    is_ucc_available,
    is_xccl_available,
    new_subgroups,
    new_subgroups_by_enumeration,
    split_group,
    supports_complex,
)
from commlayer.facade.monitor.dumps import dump_flight_recorder
from commlayer.facade.ops.batch_p2p import P2POp, batch_isend_irecv
from commlayer.facade.ops.breakpoint import breakpoint
from commlayer.facade.ops.coalesced import all_gather_coalesced, all_reduce_coalesced
from commlayer.facade.ops.in_place import all_reduce, broadcast
from commlayer.facade.ops.into_tensor import all_gather_into_tensor, all_to_all_single, reduce_scatter_tensor
from commlayer.facade.ops.monitored_barrier import monitored_barrier
from commlayer.facade.ops.objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from commlayer.facade.ops.p2p import irecv, isend, recv, send
from commlayer.facade.ops.rooted import gather, reduce, scatter
from commlayer.facade.ops.tensor_lists import all_gather, all_to_all, barrier, reduce_scatter
from commlayer.facade.ops.uneven import all_gather_v, reduce_scatter_v
from commlayer.facade.torch_bridge.groups import init_device_mesh, register_with_torch
from commlayer.facade.torch_bridge.names import *
from commlayer.facade.torch_bridge.names import OPTIONAL_NAMES, torch_submodule
from commlayer.facade.torch_bridge.names import __all__ as _torch_names_all
from commlayer.facade.torch_bridge.traceable import install as install_traceable_forms

# Other torch spellings of the tensor-in/tensor-out collectives: the pre-2.0 ones and 2.13's.
_all_gather_base = all_gather_single = all_gather_into_tensor
_reduce_scatter_base = reduce_scatter_single = reduce_scatter_tensor
# torch.distributed.init_process_group("commlayer") runs torch on commlayer's backends.
register_with_torch()
# Under torch.compile, collectives trace as torch's functional collectives (registered with Dynamo).
install_traceable_forms()
# torch's deprecated spelling of ReduceOp.
reduce_op = ReduceOp


def __getattr__(name: str) -> Any:
    """torch.distributed's submodules, version-dependent names and commlayer's facade extensions
    (``dist.comms_logger``; see :mod:`commlayer.facade.lifecycle.extensions`), resolved on first use."""
    module: ModuleType | None = torch_submodule(name)
    if module is not None:
        return module
    if name in OPTIONAL_NAMES and hasattr(_torch_dist, name):
        return getattr(_torch_dist, name)
    extension = extensions.load(name)  # dist.comms_logger and other entry-point extensions
    if extension is not None:
        return extension
    raise AttributeError(f"module 'commlayer.dist' has no attribute '{name}'")


__all__ = [  # noqa: PLE0604 - torch's names are strings too, listed at import
    "GroupMember",
    "P2POp",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_gather_v",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "breakpoint",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "dump_flight_recorder",
    "gather",
    "gather_object",
    "get_backend",
    "get_backend_config",
    "get_default_backend_for_device",
    "get_global_rank",
    "get_group_rank",
    "get_pg_count",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_device_mesh",
    "init_process_group",
    "irecv",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_ucc_available",
    "is_xccl_available",
    "isend",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "reduce_scatter_v",
    "scatter",
    "scatter_object_list",
    "send",
    "shrink_group",
    "send_object_list",
    "split_group",
    "supports_complex",
    *[name for name in _torch_names_all if name != "torch_submodule"],
]
