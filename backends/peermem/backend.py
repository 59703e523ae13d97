"""The ``peermem`` backend: NCCL's communicator, with commlayer's own kernels for the calls they win.

all_reduce, all_gather_into_tensor and reduce_scatter_tensor of float32, bfloat16 and float16
tensors, and all_to_all_single of any dtype, on a group whose ranks share one host run as one
kernel over peer-mapped device memory whenever the measured crossover table (:mod:`.routing`)
says that beats NCCL; every other call, and every group spanning hosts, runs on NCCL unchanged.
Medium and large calls read and write the callers' tensors in place once their segments are
registered (:mod:`.registry`); :meth:`PeermemBackend.register_graph_buffers` does the same for
calls captured in CUDA graphs. The kernels reduce in rank order, so every rank ends with bitwise
the same result. They run on the caller's stream, so CUDA graphs capture them like any kernel;
asynchronous calls of ``COMMLAYER_PEERMEM_ASYNC_BYTES`` or more issued from the default stream
run on a stream of the group's own instead, beside the caller's compute, as NCCL's do. A peer
that never reaches a kernel's flag ends the wait after the group's timeout; the next call or
``wait()`` of the group raises CommTimeoutError naming it.

Environment: ``COMMLAYER_PEERMEM=0`` sends every call to NCCL; ``COMMLAYER_PEERMEM_BYTES`` sets the
staging bytes per call (default 32 MiB; each rank maps two such halves per group);
``COMMLAYER_PEERMEM_ALGORITHM`` forces one_shot, two_shot, push or nccl wherever the kernels fit
(benchmarks); ``COMMLAYER_PEERMEM_ASYNC_BYTES`` (default 1 MiB) is the smallest asynchronous
call run on the group's own stream; ``COMMLAYER_PEERMEM_CACHE`` is where the nvcc build is kept
(default ``~/.cache/commlayer/peermem``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor

from commlayer.backends.nccl import NcclBackend
from commlayer.backends.peermem.attach import attach
from commlayer.backends.peermem.communicator import PeerComm
from commlayer.backends.peermem.fast_path import kernel_path
from commlayer.core.flight_recorder import Recording
from commlayer.core.types import GroupSpec, ReduceOp, Splits
from commlayer.core.work import Work

__all__ = ["PeermemBackend"]

_OWN_OPS = frozenset({"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"})


# The tensor a routed op's flight-recorder entry describes (as NCCL's launchers do).
_PAYLOAD = {"all_reduce": 0, "all_gather_into_tensor": 0, "reduce_scatter_tensor": 1, "all_to_all_single": 1}


def _kernel_check(comm: PeerComm, op: str, fixed: tuple[Any, ...]) -> Callable[..., bool]:
    """Whether the kernels serve a call of ``op`` (the same routing the op's method applies)."""
    route = comm.route
    if op == "all_reduce":
        reduce_op = fixed[0]
        return lambda tensor: (
            route(op, tensor.numel() * tensor.element_size(), tensor.dtype, reduce_op) is not None
        )
    if op == "all_gather_into_tensor":
        return lambda output, tensor: (
            route(op, output.numel() * output.element_size(), output.dtype, None) is not None
        )
    reduce_op = fixed[0]
    return lambda output, tensor: (
        route(op, tensor.numel() * tensor.element_size(), tensor.dtype, reduce_op) is not None
    )


class PeermemBackend(NcclBackend):
    name = "peermem"

    def __init__(self, spec: GroupSpec, process_group: Any) -> None:
        super().__init__(spec, process_group)
        self._comm: PeerComm | None = attach(spec)

    @property
    def serves_locally(self) -> bool:
        """Whether this group's ranks share one host and its kernels are mapped."""
        return self._comm is not None

    @property
    def peer_comm(self) -> PeerComm | None:
        """The group's kernels (None when NCCL serves every call): for commlayer.parallel's fused
        ops and the benchmarks."""
        return self._comm

    def register_graph_buffers(self, timeout: timedelta | None = None) -> int:
        """After capturing CUDA graphs, let their calls read and write their tensors in place.

        Collective over the group: call it on every member, between replays. Returns how many
        captured calls now run without staging copies (0 where NCCL serves the group).
        """
        return 0 if self._comm is None else self._comm.placement.register_graph_buffers(timeout)

    def shutdown(self) -> None:
        if self._comm is not None:
            self._comm.close()
            self._comm = None
        super().shutdown()

    def recorded_plan(
        self, op: str, fixed: tuple[Any, ...], recording: Recording
    ) -> Callable[..., Work | None] | None:
        """NCCL's fast path (C where built) for every call the kernels do not serve; a routed op's
        fast path picks per call between it and the kernels, both entering the flight recorder
        (in C where built: :mod:`.fast_path`; the Python one below is its reference)."""
        nccl = super().recorded_plan(op, fixed, recording)
        comm = self._comm
        if comm is None or op not in _OWN_OPS or nccl is None:
            return nccl  # None: the facade's launcher calls this class's methods, which route
        if op == "all_to_all_single" and not comm.serves_all_to_all():
            return nccl  # one choice per group: NCCL's, or the kernel for every call
        kernel = recording.method_fast_path(_PAYLOAD[op], getattr(self, op), fixed)
        if op == "all_to_all_single":
            return kernel_path(comm, op, fixed, recording, nccl, kernel) or kernel
        served = _kernel_check(comm, op, fixed)

        def run(async_op: bool, *tensors: torch.Tensor) -> Work | None:
            return (kernel if served(*tensors) else nccl)(async_op, *tensors)

        return kernel_path(comm, op, fixed, recording, nccl, run) or run

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> Work:
        comm = self._comm
        if comm is not None:
            nbytes = tensor.numel() * tensor.element_size()
            route = comm.route("all_reduce", nbytes, tensor.dtype, op)
            if route is not None and tensor.get_device() == comm.device:
                return comm.launch(route, tensor, tensor, nbytes, async_op)
        return super().all_reduce(tensor, op, async_op=async_op)

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        comm = self._comm
        if comm is not None and output.dtype == tensor.dtype:
            nbytes = output.numel() * output.element_size()
            route = comm.route("all_gather_into_tensor", nbytes, output.dtype, None)
            if route is not None and output.get_device() == comm.device == tensor.get_device():
                return comm.launch(route, tensor, output, nbytes // self.size, async_op)
        return super().all_gather_into_tensor(output, tensor, async_op=async_op)

    def reduce_scatter_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        comm = self._comm
        if comm is not None and output.dtype == tensor.dtype:
            nbytes = tensor.numel() * tensor.element_size()
            route = comm.route("reduce_scatter_tensor", nbytes, tensor.dtype, op)
            if route is not None and output.get_device() == comm.device == tensor.get_device():
                return comm.launch(route, tensor, output, nbytes // self.size, async_op)
        return super().reduce_scatter_tensor(output, tensor, op, async_op=async_op)

    def all_to_all_single(
        self, output: Tensor, tensor: Tensor, out_splits: Splits, in_splits: Splits, *, async_op: bool = True
    ) -> Work:
        comm = self._comm
        if (
            comm is not None
            and output.dtype == tensor.dtype
            and output.get_device() == comm.device == tensor.get_device()
        ):
            work = comm.all_to_all(output, tensor, out_splits, in_splits, async_op)
            if work is not None:
                return work
        return super().all_to_all_single(output, tensor, out_splits, in_splits, async_op=async_op)
