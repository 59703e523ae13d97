"""The C fast path of the ops peermem's kernels serve (``csrc/peermem_fast_paths``).

:meth:`PeermemBackend.recorded_plan <commlayer.backends.peermem.backend.PeermemBackend.recorded_plan>`
builds a Python fast path per routed op that picks, per call, between the kernels and NCCL's fast
path; it stays the reference (the twin) and the fallback (``COMMLAYER_C_FAST_PATHS=0``). Where the
extension is built, :func:`kernel_path` wraps it in a ``KernelPath`` that launches the calls served
through the staging region with no Python frame, those served in place or issued on another
stream with one (the segment registry's :meth:`Placement.places`, :meth:`StreamOrder.stream`), and
hands NCCL's sizes straight to NCCL's fast path; what it leaves to the twin is listed in
``kernel_path.c``. all_to_all_single takes it too on a group whose kernel serves that op: its
splits become the kernel's byte table in C, its tensors placed by the registry.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Any

import torch

from commlayer.backends.peermem.communicator import PeerComm, Route
from commlayer.contract.fast_paths import FastPath, c_fast_paths_enabled
from commlayer.core.flight_recorder import Recording
from commlayer.core.types import ReduceOp

try:
    from commlayer.backends.peermem import _fast_paths as native
except ImportError:  # not built (a tree laid out without building): the Python twin serves
    native = None
else:
    from commlayer.core.tensor_reader import tensor_meta_reader

    native.set_tensor_meta(tensor_meta_reader())

__all__ = ["KERNEL_OPS", "kernel_path", "route_verdict"]

#: The ops the C fast path serves, by its op number.
KERNEL_OPS = {
    "all_reduce": 0,
    "all_gather_into_tensor": 1,
    "reduce_scatter_tensor": 2,
    "all_to_all_single": 3,
}

#: c10's number of the CUDA device type, as the C tensor reader reads it.
CUDA_DEVICE_TYPE = 1

#: A route as the C fast path caches it: ``(code, blocks)`` to launch through the staging region,
#: ``(code, blocks, True)`` to launch with its tensors placed by the segment registry (zero-copy
#: routes), None for NCCL.
Verdict = tuple[int, int] | tuple[int, int, bool] | None


def route_verdict(route: Route | None) -> Verdict:
    """How the C fast path runs a call of ``route``."""
    if route is None:
        return None
    return (route.code, route.blocks, True) if route.op else (route.code, route.blocks)


def _route_of(comm: PeerComm, op: str, reduce_op: ReduceOp | None) -> Callable[[torch.Tensor], Verdict]:
    """The verdict for a call whose routed tensor (all_gather's output, the others' input) is given."""
    if op == "all_to_all_single":  # one choice per group (the path exists only where it is the kernel)
        verdict = (0, comm.all_to_all_blocks, True)
        return lambda tensor: verdict
    return lambda tensor: route_verdict(
        comm.route(op, tensor.numel() * tensor.element_size(), tensor.dtype, reduce_op)
    )


def kernel_path(
    comm: PeerComm, op: str, fixed: tuple[Any, ...], recording: Recording, nccl: FastPath, twin: FastPath
) -> FastPath | None:
    """The C fast path of ``op`` (its trailing arguments ``fixed``), or None where the twin serves."""
    if native is None or op not in KERNEL_OPS or not c_fast_paths_enabled():
        return None
    reduce_op = fixed[0] if op in ("all_reduce", "reduce_scatter_tensor") else None
    exchange = op == "all_to_all_single"
    launch = comm.lib.lib.pm_all_to_all if exchange else comm.lib.lib.pm_launch
    return native.KernelPath(
        op=KERNEL_OPS[op],
        device_type=CUDA_DEVICE_TYPE,
        device=comm.device,
        world=comm.world,
        async_bytes=comm.async_bytes,
        default_stream=comm.default_stream,
        launch=ctypes.cast(launch, ctypes.c_void_p).value,
        handle=comm.handle,
        failed=ctypes.addressof(comm.failed),
        comm=comm,
        places=functools.partial(comm.placement.places, op),
        route_of=_route_of(comm, op, reduce_op),
        order=comm.order,
        raw_stream=torch._C._cuda_getCurrentRawStream,
        nccl=nccl,
        twin=twin,
        started_work=comm.started_work,
        launch_failed=comm.launch_failed,
        raise_failed=functools.partial(comm.raise_if_failed, "wait"),
        recording=recording,
        push_bytes=comm.all_to_all_push_bytes,
        routes=comm.verdict_table(op, reduce_op),
    )
