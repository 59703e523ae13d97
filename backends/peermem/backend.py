"""The ``peermem`` backend: NCCL's communicator, with commlayer's own kernels for the calls they win.

all_reduce, all_gather_into_tensor and reduce_scatter_tensor of float32, bfloat16 and float16
tensors on a group whose ranks share one host run as one kernel over peer-mapped device memory
whenever the measured crossover table (:mod:`.routing`) says that beats NCCL; every other call,
and every group spanning hosts, runs on NCCL unchanged. The kernels reduce in rank order, so every
rank ends with bitwise the same result, and they run on the caller's stream, so CUDA graphs
capture them like any kernel. A peer that never reaches a kernel's flag ends the wait after the
group's timeout; the next call or ``wait()`` of the group raises CommTimeoutError naming it.

Environment: ``COMMLAYER_PEERMEM=0`` sends every call to NCCL; ``COMMLAYER_PEERMEM_BYTES`` sets the
staging bytes per call (default 32 MiB; each rank maps two such halves per group);
``COMMLAYER_PEERMEM_ALGORITHM`` forces one_shot, two_shot, push or nccl wherever the kernels fit
(benchmarks); ``COMMLAYER_PEERMEM_CACHE`` is where the nvcc build is kept (default
``~/.cache/commlayer/peermem``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from commlayer.backends.nccl import NcclBackend
from commlayer.backends.peermem.communicator import PeerComm, attach
from commlayer.core.flight_recorder import Recording
from commlayer.core.types import GroupSpec, ReduceOp
from commlayer.core.work import Work

__all__ = ["PeermemBackend"]

_OWN_OPS = frozenset({"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"})


class PeermemBackend(NcclBackend):
    name = "peermem"

    def __init__(self, spec: GroupSpec, process_group: Any) -> None:
        super().__init__(spec, process_group)
        self._comm: PeerComm | None = attach(spec)

    @property
    def serves_locally(self) -> bool:
        """Whether this group's ranks share one host and its kernels are mapped."""
        return self._comm is not None

    def shutdown(self) -> None:
        if self._comm is not None:
            self._comm.close()
            self._comm = None
        super().shutdown()

    def recorded_plan(
        self, op: str, fixed: tuple[Any, ...], recording: Recording
    ) -> Callable[..., Work | None] | None:
        # NCCL's fused plans call the ProcessGroup directly; the routed ops need this class's methods.
        if op in _OWN_OPS and self._comm is not None:
            return None
        return super().recorded_plan(op, fixed, recording)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> Work:
        comm = self._comm
        if comm is not None:
            nbytes = tensor.numel() * tensor.element_size()
            route = comm.route("all_reduce", nbytes, tensor.dtype, op)
            if route is not None and tensor.get_device() == comm.device:
                work = comm.launch(route, tensor, tensor, nbytes, async_op)
                if work is not None:
                    return work
        return super().all_reduce(tensor, op, async_op=async_op)

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        comm = self._comm
        if comm is not None and output.dtype == tensor.dtype:
            nbytes = output.numel() * output.element_size()
            route = comm.route("all_gather_into_tensor", nbytes, output.dtype, None)
            if route is not None and output.get_device() == comm.device == tensor.get_device():
                work = comm.launch(route, tensor, output, nbytes // self.size, async_op)
                if work is not None:
                    return work
        return super().all_gather_into_tensor(output, tensor, async_op=async_op)

    def reduce_scatter_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        comm = self._comm
        if comm is not None and output.dtype == tensor.dtype:
            nbytes = tensor.numel() * tensor.element_size()
            route = comm.route("reduce_scatter_tensor", nbytes, tensor.dtype, op)
            if route is not None and output.get_device() == comm.device == tensor.get_device():
                work = comm.launch(route, tensor, output, nbytes // self.size, async_op)
                if work is not None:
                    return work
        return super().reduce_scatter_tensor(output, tensor, op, async_op=async_op)
