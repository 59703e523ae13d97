"""NCCL through torch.distributed: CUDA collectives as torch runs them, and the base of peermem (the
default on CUDA, which adds commlayer's own kernels for the intra-host calls they win; the defaults
are in :mod:`commlayer.contract.selection`)."""

from __future__ import annotations

import threading

import torch
import torch.distributed as torch_dist

from commlayer.backends.torch_base import TorchBackend
from commlayer.contract.backend import StandaloneOptions
from commlayer.core.types import Availability, Capabilities, GroupSpec, ReduceOp

__all__ = ["NcclBackend"]


class NcclBackend(TorchBackend):
    name = "nccl"
    torch_backend = "nccl"
    # NCCL has no bitwise reductions; torch refuses BAND/BOR/BXOR on it, so we declare them absent.
    capabilities = Capabilities(
        devices=frozenset({"cuda"}),
        reduce_ops=frozenset({ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX}),
        native_avg=True,
        native_reduce_scatter=True,
        p2p_tags=False,  # NCCL matches send/recv by order; torch passes tags through and drops them
    )
    builds_standalone = True

    @classmethod
    def is_available(cls) -> Availability:
        if not torch.cuda.is_available():
            return Availability.no("no CUDA device is visible (torch.cuda.is_available() is False)")
        return super().is_available()

    @classmethod
    def create_standalone(cls, spec: GroupSpec, options: StandaloneOptions) -> NcclBackend:
        """An NCCL communicator of the members alone on the current CUDA device.

        It connects here rather than at its first op: the unique id's exchange then waits in
        the store, bounded by the store's timeout, and never inside an op that a dead member
        would hold forever.
        """
        store = torch_dist.PrefixStore(f"{spec.name}/nccl", spec.store)
        nccl_options = torch_dist.ProcessGroupNCCL.Options()
        nccl_options._timeout = spec.timeout
        process_group = torch_dist.ProcessGroupNCCL(store, spec.group_rank, spec.size, nccl_options)
        process_group.eager_connect_single_device(torch.device("cuda", torch.cuda.current_device()))
        return cls(spec, process_group)

    def abort(self) -> None:
        """Start aborting the NCCL communicators and return without waiting for the abort.

        ``ncclCommAbort`` can wait for good on a kernel whose peer died; the communicator is
        abandoned either way, so a daemon thread runs it and the caller goes on at once.
        """
        threading.Thread(target=self._pg.abort, name="commlayer-nccl-abort", daemon=True).start()

    def object_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())
