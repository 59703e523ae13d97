"""``from commlayer import dist``: a drop-in for ``import torch.distributed as dist``.

Same functions, arguments and semantics; each call is validated, resolved to its group and handed
to the registered backend serving the tensor's device.
"""

from __future__ import annotations

from ..types import ReduceOp
from ..work import Work
from ._collectives import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
)
from ._groups import GroupMember, ProcessGroup, group
from ._objects import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from ._p2p import P2POp, batch_isend_irecv, irecv, isend, monitored_barrier, recv, send
from ._setup import (
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
)

from .. import comms_logger  # noqa: E402 - hooks into _dispatch, imported above

# Other torch spellings of the tensor-in/tensor-out collectives: the pre-2.0 ones and 2.13's.
_all_gather_base = all_gather_single = all_gather_into_tensor
_reduce_scatter_base = reduce_scatter_single = reduce_scatter_tensor

__all__ = [
    "GroupMember",
    "P2POp",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "comms_logger",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
]
