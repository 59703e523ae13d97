"""HCCL (Huawei Ascend NPUs) through the process group of torch_npu.

torch_npu registers a torch.distributed backend named "hccl" for its NPU tensors; this backend
is the shared torch-backed base (:class:`~commlayer.backends.torch_base.TorchBackend`) pointed at it,
so ``group.torch_group`` is torch_npu's own ProcessGroupHCCL. It is picked automatically on a
host where torch_npu reports an NPU (``commlayer.contract.selection`` maps the ``npu`` accelerator to
``cpu:gloo,npu:hccl``).

No Ascend NPU was available to this project: the dispatch path is tested end to end with a test
double of torch_npu (tests/backends/doubles/fake_torch_npu_double), never against real HCCL.

Importing this module imports torch_npu when it is installed, because torch_npu's import is
what registers the "hccl" torch backend and ``torch.npu``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch
import torch.distributed as torch_dist

from commlayer.backends.torch_base import TorchBackend
from commlayer.core.types import Availability, Capabilities, ReduceOp

__all__ = ["INSTALL_HINT", "HcclBackend"]

TORCH_NPU = "torch_npu"
INSTALL_HINT = (
    "on a host with Ascend NPUs and the CANN toolkit: pip install torch-npu "
    "(the release matching your torch version), then `import torch_npu` in your script"
)

# HCCL's datatypes as torch_npu maps them; bool is left out because torch_npu reduces it as
# uint8, which SUM would push past 1.
HCCL_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.bfloat16,
        torch.float16,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
    }
)
# HCCL reduces with SUM, PROD, MIN and MAX; AVG runs as SUM and a division (the facade).
HCCL_REDUCE_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX})


def _import_torch_npu() -> tuple[ModuleType | None, str]:
    try:
        return importlib.import_module(TORCH_NPU), ""
    except ImportError as error:
        return None, f"{type(error).__name__}: {error}"


def _hccl_devices() -> frozenset[str]:
    """The device types torch_npu registered its "hccl" torch backend for (``["npu"]``)."""
    registered = torch_dist.Backend.backend_capability.get("hccl") if torch_dist.is_available() else None
    return frozenset(registered or ("npu",))


_torch_npu, _torch_npu_error = _import_torch_npu()


class HcclBackend(TorchBackend):
    name = "hccl"
    torch_backend = "hccl"
    capabilities = Capabilities(devices=_hccl_devices(), dtypes=HCCL_DTYPES, reduce_ops=HCCL_REDUCE_OPS)
    install_hint = INSTALL_HINT
    # torch_npu's ProcessGroupHCCL raises for gather and scatter; the send/recv fallbacks serve them.
    generic_ops = frozenset({"gather", "scatter"})

    @classmethod
    def is_available(cls) -> Availability:
        if _torch_npu is None:
            return Availability.no(f"torch_npu is not installed ({_torch_npu_error})", INSTALL_HINT)
        npu = getattr(torch, "npu", None)
        if npu is None or not npu.is_available():
            reason = "torch_npu is installed but reports no NPU (torch.npu.is_available() is False)"
            return Availability.no(reason, INSTALL_HINT)
        return super().is_available()

    def object_device(self) -> torch.device:
        if "npu" not in self.capabilities.devices:
            return torch.device("cpu")
        return torch.device("npu", torch.npu.current_device())
