"""TEST DOUBLE of torch_npu -- NOT Huawei's torch_npu, and no NPU or HCCL is involved.

No Ascend NPU was available to this project, so commlayer's ``hccl`` backend is tested through
this stand-in. Put ``tests/backends/doubles/fake_torch_npu_double`` on PYTHONPATH and ``import torch_npu``
does what the real import does for the dispatch path:

1. registers a torch.distributed backend named "hccl" (as torch_npu does, extended API), whose
   process group is really torch's **gloo** underneath;
2. installs ``torch.npu`` with ``is_available()``, ``device_count()``, ``current_device()`` and
   ``set_device()``, so commlayer's accelerator detection sees an NPU.

The one deliberate difference: tensors cannot live on an "npu" device without the real runtime,
so the double registers "hccl" for the **cpu** device (the real one registers ``["npu"]``), and
commlayer's hccl backend, which takes its devices from that registration, accepts CPU tensors.

``FAKE_TORCH_NPU_DOUBLE_DEVICES=0`` makes ``torch.npu.is_available()`` report no NPU.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import torch
import torch.distributed as torch_dist

IS_TEST_DOUBLE = True
__version__ = "0.0.0+test-double"

DEVICES_ENV = "FAKE_TORCH_NPU_DOUBLE_DEVICES"


def _device_count() -> int:
    return int(os.environ.get(DEVICES_ENV, "1"))


class _FakeNpuModule(types.ModuleType):
    """``torch.npu``: just enough for device detection and set_device."""

    def __init__(self) -> None:
        super().__init__("torch.npu", "torch.npu of the torch_npu TEST DOUBLE")
        self._current = 0

    def is_available(self) -> bool:
        return _device_count() > 0

    def device_count(self) -> int:
        return _device_count()

    def current_device(self) -> int:
        return self._current

    def set_device(self, device: Any) -> None:
        self._current = device if isinstance(device, int) else torch.device(device).index or 0


def _create_process_group(options: Any, pg_options: Any) -> Any:
    """The "hccl" process group: gloo over the same store, rank, size and timeout."""
    return torch_dist.ProcessGroupGloo(
        options.store, options.group_rank, options.group_size, timeout=options.timeout
    )


def _install() -> None:
    torch.npu = _FakeNpuModule()
    sys.modules["torch.npu"] = torch.npu
    torch_dist.Backend.register_backend("hccl", _create_process_group, extended_api=True, devices=["cpu"])
    torch_dist.is_hccl_available = lambda: True


_install()
