"""The shm backend without a world: reduction kernels against torch, window copies, options, host identity."""

from __future__ import annotations

from functools import reduce as fold

import pytest
import torch

from commlayer.backends.shm import ShmBackend, ShmOptions
from commlayer.backends.shm.native import DTYPE_CODES, OP_CODES, load_extension
from commlayer.core.errors import InvalidArgumentError
from commlayer.core.hosts import HOST_ID_ENV, HostMap, host_identity
from commlayer.core.types import ReduceOp
from commlayer.testing.conformance import ops_for

NATIVE = load_extension()
HALF = (torch.bfloat16, torch.float16)


def _inputs(dtype: torch.dtype, count: int, parts: int, op: ReduceOp) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(count * 31 + parts)
    if dtype is torch.bool:
        return [torch.rand(count, generator=generator) < 0.5 for _ in range(parts)]
    if dtype.is_floating_point:
        scale = 2.0 if op is ReduceOp.PRODUCT else 100.0
        return [(torch.rand(count, generator=generator) * scale - scale / 2).to(dtype) for _ in range(parts)]
    info = torch.iinfo(dtype)
    low, high = max(info.min, -1000), min(info.max, 1000)
    return [torch.randint(low, high, (count,), generator=generator, dtype=dtype) for _ in range(parts)]


def _expected(inputs: list[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    dtype = inputs[0].dtype
    wide = [t.float() for t in inputs] if dtype in HALF else inputs
    if dtype is torch.bool:
        binary = {ReduceOp.SUM: torch.logical_or, ReduceOp.PRODUCT: torch.logical_and}.get(op)
    else:
        binary = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PRODUCT: torch.mul}.get(op)
    binary = (
        binary
        or {
            ReduceOp.MIN: torch.minimum,
            ReduceOp.MAX: torch.maximum,
            ReduceOp.BAND: torch.bitwise_and,
            ReduceOp.BOR: torch.bitwise_or,
            ReduceOp.BXOR: torch.bitwise_xor,
        }[op]
    )
    result = fold(binary, wide)
    if op is ReduceOp.AVG:
        result = result / len(inputs)
    return result.to(dtype)


@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_kernels_match_torch_for_every_dtype_and_op(dtype: torch.dtype, parts: int) -> None:
    for op in ops_for(dtype):
        for count in (1, 17, 513, 4099):
            inputs = _inputs(dtype, count, parts, op)
            out = torch.empty_like(inputs[0])
            NATIVE.reduce(
                out.data_ptr(), [t.data_ptr() for t in inputs], count, DTYPE_CODES[dtype], OP_CODES[op], parts
            )
            expected = _expected(inputs, op)
            if dtype.is_floating_point and dtype not in HALF:
                torch.testing.assert_close(out, expected, msg=f"{dtype} {op} {count}")
            else:  # integers are exact; 16-bit floats accumulate in float32 and round once
                assert torch.equal(out, expected), f"{dtype} {op} parts={parts} count={count}"


def test_kernel_reduces_in_place_when_the_output_is_the_first_input() -> None:
    a, b = torch.arange(1000, dtype=torch.float32), torch.full((1000,), 2.0)
    NATIVE.reduce(a.data_ptr(), [a.data_ptr(), b.data_ptr()], 1000, DTYPE_CODES[torch.float32], 0, 2)
    assert torch.equal(a, torch.arange(1000, dtype=torch.float32) + 2)


def test_kernels_are_vectorised_for_this_cpu() -> None:
    assert NATIVE.kernel_isa() in ("avx512", "avx2", "baseline")


@pytest.mark.parametrize(
    "fields",
    [{"small_bytes": 10}, {"chunk_bytes": 100}, {"spins": -1}, {"small_bytes": 1000}, {"chunk_bytes": "1"}],
)
def test_bad_options_are_rejected_naming_the_field(fields: dict) -> None:
    with pytest.raises(InvalidArgumentError, match="ShmOptions"):
        ShmOptions(**fields)


def test_pg_options_of_another_type_are_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="pg_options.*ShmOptions.*rank 3"):
        ShmOptions.resolve(object(), 3)
    assert ShmOptions.resolve(None, 0) == ShmOptions()


def test_host_identity_is_the_kernel_and_dev_shm_unless_overridden() -> None:
    assert host_identity({}) == host_identity({})
    assert host_identity({HOST_ID_ENV: "a"}) != host_identity({HOST_ID_ENV: "b"})
    assert host_identity({HOST_ID_ENV: "a"}) != host_identity({})


def test_host_map_leaders_are_the_lowest_rank_of_each_host() -> None:
    hosts = HostMap(hosts=((0, 2), (1, 3)), pids=(10, 11, 12, 13))
    assert hosts.leaders == (0, 1) and not hosts.single_host
    assert [hosts.host_of(rank) for rank in range(4)] == [0, 1, 0, 1]


def test_backend_is_available_here() -> None:
    assert ShmBackend.is_available(), ShmBackend.is_available().reason


# From 8 MiB the copy streams past the cache, in 1, 2 and 4 interleaved runs plus a remainder.
@pytest.mark.parametrize("nbytes", [0, 1, 63, 4096 + 5, (8 << 20) + 77, (16 << 20) + 77, (40 << 20) + 4099])
@pytest.mark.parametrize("misalign", [0, 1, 37])
def test_window_copy_is_exact_at_every_size_and_alignment(nbytes: int, misalign: int) -> None:
    source = torch.randint(0, 256, (nbytes + 64,), dtype=torch.uint8)
    target = torch.zeros(nbytes + 128, dtype=torch.uint8)
    NATIVE.copy(target.data_ptr() + misalign, source.data_ptr() + 3, nbytes)
    assert torch.equal(target[misalign : misalign + nbytes], source[3 : 3 + nbytes])
    assert not target[:misalign].any() and not target[misalign + nbytes :].any()
