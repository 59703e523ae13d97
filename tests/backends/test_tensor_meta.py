"""Pure logic: the C launchers' tensor reader (csrc/tensor_meta, commlayer.core._tensor_meta).

It reads a tensor's dtype, device, layout, contiguity and sizes from its at::Tensor; it must agree
with the tensor's Python attributes wherever it answers, answer nothing for what Python may answer
differently (a subclass, an active torch function mode), and be used only under the torch version
whose headers it was built against.
"""

from __future__ import annotations

import subprocess
import sys
import types
from typing import Any

import pytest
import torch

from commlayer.core import tensor_reader as _tensor_reader

from ._tensor_kinds import PassThroughMode, Traced

tensor_meta = _tensor_reader._tensor_meta
pytestmark = pytest.mark.skipif(
    _tensor_reader.tensor_meta_reader() is None, reason="no C tensor reader built for this torch"
)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool, torch.complex64]  # fmt: skip


def _python_view(tensor: torch.Tensor) -> tuple[Any, ...]:
    index = -1 if tensor.device.index is None else tensor.device.index
    contiguous = tensor.layout == torch.strided and tensor.is_contiguous()
    return index, contiguous, tuple(tensor.shape), tensor.element_size()


@pytest.mark.parametrize(
    "tensor",
    [torch.ones(3, 4), torch.ones(3, 4).t(), torch.ones(8)[::2], torch.ones(0), torch.tensor(5.0),
     torch.ones(2, 3, 4, 5, 1, 1, 1, 2), torch.nn.Parameter(torch.ones(2)), torch.ones(4).to_sparse()],
    ids=["matrix", "transposed", "strided", "empty", "scalar", "eight-dims", "parameter", "sparse"],
)  # fmt: skip
def test_the_reader_agrees_with_the_python_attributes(tensor: torch.Tensor) -> None:
    _, device_type, device_index, layout, contiguous, sizes, itemsize, data = tensor_meta.describe(tensor)
    assert (device_index, contiguous, sizes, itemsize) == _python_view(tensor)
    assert device_type == tensor_meta.describe(torch.ones(1))[1]  # every tensor here is on the CPU
    assert (layout == 0) == (tensor.layout == torch.strided)
    assert data == (tensor.data_ptr() if tensor.layout == torch.strided else 0)  # sparse: no storage


def test_each_dtype_reads_as_its_own_scalar_type() -> None:
    read = [tensor_meta.describe(torch.zeros(2, dtype=dtype))[0] for dtype in DTYPES]
    assert len(set(read)) == len(DTYPES)
    assert read == [tensor_meta.describe(torch.ones(5, dtype=dtype))[0] for dtype in DTYPES]


def test_what_python_may_answer_differently_is_not_read() -> None:
    assert tensor_meta.describe(torch.ones(2).as_subclass(Traced)) is None
    with PassThroughMode():
        assert tensor_meta.describe(torch.ones(2)) is None
    assert tensor_meta.describe(torch.ones(2)) is not None
    assert tensor_meta.describe(torch.ones(*[1] * 9)) is None  # more dimensions than it holds
    assert tensor_meta.describe([1.0, 2.0]) is None and tensor_meta.describe(None) is None


def test_a_reader_built_for_another_torch_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tensor_meta.BUILT_FOR == torch.__version__
    other = types.SimpleNamespace(BUILT_FOR="1.0.0", READER=tensor_meta.READER)
    monkeypatch.setattr(_tensor_reader, "_tensor_meta", other)
    assert _tensor_reader.tensor_meta_reader() is None


def test_the_facade_hands_the_reader_to_the_lookups_without_any_torch_backend() -> None:
    """commlayer.dist installs the reader where it makes the lookups: a world of mpi, ccl or shm
    alone, which never imports the torch backends' modules, reads tensors in C too."""
    code = """
import sys, torch
from commlayer import dist
from commlayer.facade.calls import _fast_paths as native
assert "commlayer.backends.torch_fast_paths" not in sys.modules
out, tensor, no_plan = torch.zeros(4), torch.ones(2), object()
key = ("all_gather_into_tensor", None, *(t for x in (out, tensor) for t in (x.dtype, x.device, x.layout)))
plans = {key: (lambda async_op, *tensors: "ran", None, 2)}
print(native.PlannedPaired(plans, "all_gather_into_tensor", 0, no_plan)(out, tensor, None, False, None, None))
"""
    ran = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0 and ran.stdout.strip() == "ran", ran.stderr
