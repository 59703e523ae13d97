"""Wiring: bad input raises a clear error locally, before any communication, and never hangs.

Each message names the op, the argument, what was expected, what was received and the rank. A
world of one in this process is enough: every check here fires before a backend is called.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as torch_dist

import commlayer
from commlayer import dist
from commlayer.core.errors import (
    AlreadyInitializedError,
    InvalidArgumentError,
    InvalidTypeError,
    NotInitializedError,
    UnsupportedError,
)
from commlayer.core.rendezvous import RendezvousEnvError


def test_ops_before_init_say_how_to_fix_it() -> None:
    with pytest.raises(NotInitializedError, match=r"all_reduce: .*not initialized.*init_process_group"):
        dist.all_reduce(torch.ones(1))
    with pytest.raises(NotInitializedError, match="get_rank"):
        dist.get_rank()
    assert dist.group.WORLD is None


def test_double_init_is_rejected_with_torchs_error_type(world_of_one: None) -> None:
    with pytest.raises(
        AlreadyInitializedError, match=r"init_process_group: already initialized \(rank 0\)"
    ) as raised:
        dist.init_process_group("gloo", store=torch_dist.HashStore(), rank=0, world_size=1)
    assert isinstance(raised.value, ValueError)  # what torch raises for a second init


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda: dist.broadcast(torch.ones(2), src=1),
            r"broadcast: argument 'src' expected a global rank in the group \[0\], received 1 \(rank 0\)",
        ),
        (
            lambda: dist.reduce(torch.ones(2), dst=-1),
            r"reduce: argument 'dst' expected a global rank in the group \[0\], received -1",
        ),
        (
            lambda: dist.send(torch.ones(2), dst=0),
            r"send: argument 'dst' expected a rank other than this one, received 0 \(rank 0\)",
        ),
        (lambda: dist.gather(torch.ones(2), None, dst=3), r"gather: argument 'dst' expected a global rank"),
    ],
)
def test_ranks_out_of_range(world_of_one: None, call, pattern: str) -> None:
    with pytest.raises(InvalidArgumentError, match=pattern):
        call()


def test_list_of_the_wrong_length(world_of_one: None) -> None:
    with pytest.raises(
        InvalidArgumentError,
        match=r"all_gather: argument 'tensor_list' expected a list of 1 tensors \(the group size\), received 2 tensors \(rank 0\)",
    ):
        dist.all_gather([torch.zeros(2), torch.zeros(2)], torch.ones(2))
    with pytest.raises(
        InvalidArgumentError, match="all_gather_object: argument 'object_list' expected a list of 1"
    ):
        dist.all_gather_object([None, None], "x")


def test_all_gather_into_tensor_output_size(world_of_one: None) -> None:
    with pytest.raises(
        InvalidArgumentError,
        match=r"all_gather_into_tensor: argument 'output_tensor' expected 2 elements \(world size 1 x input\), received 3 elements",
    ):
        dist.all_gather_into_tensor(torch.zeros(3), torch.ones(2))


def test_input_output_dtype_mismatch(world_of_one: None) -> None:
    with pytest.raises(
        InvalidArgumentError,
        match=r"argument 'output_tensor' expected dtype torch.int64 \(same as the input\), received torch.float32",
    ):
        dist.all_gather_into_tensor(torch.zeros(2), torch.ones(2, dtype=torch.int64))


def test_non_tensor_argument(world_of_one: None) -> None:
    with pytest.raises(
        InvalidTypeError,
        match=r"all_reduce: argument 'tensor' expected a torch.Tensor, received list \(rank 0\)",
    ):
        dist.all_reduce([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        dist.broadcast(3, src=0)  # type: ignore[arg-type]


def test_unsupported_dtype_and_ops(world_of_one: None) -> None:
    with pytest.raises(
        UnsupportedError,
        match=r"all_reduce: argument 'tensor' expected a dtype backend 'gloo' supports \(.*float32.*\), received torch.uint16",
    ):
        dist.all_reduce(torch.ones(2, dtype=torch.uint16))
    # Complex tensors travel as their real view where torch allows it (all_reduce); reduce refuses them.
    with pytest.raises(
        UnsupportedError, match=r"reduce: argument 'tensor' expected a dtype .* received torch.complex64"
    ):
        dist.reduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(
        UnsupportedError, match=r"all_reduce: argument 'op' expected SUM or AVG for a complex tensor"
    ):
        dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=dist.ReduceOp.MAX)
    with pytest.raises(
        UnsupportedError,
        match=r"argument 'op' expected an arithmetic op for torch.float32 \(bitwise ops need integer or bool\), received BAND",
    ):
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)
    with pytest.raises(
        UnsupportedError, match=r"argument 'op' expected an op other than AVG for torch.int32"
    ):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG)
    with pytest.raises(InvalidArgumentError, match=r"argument 'op' expected a ReduceOp .* received median"):
        dist.all_reduce(torch.ones(2), op="median")


def test_op_the_backend_does_not_declare(storecomm_module: object) -> None:
    commlayer.register_backend("storecomm-errors", storecomm_module.StoreBackend)  # type: ignore[attr-defined]
    try:
        dist.init_process_group("storecomm-errors", store=torch_dist.HashStore(), rank=0, world_size=1)
        with pytest.raises(
            UnsupportedError,
            match=r"all_reduce: argument 'op' expected one of backend 'storecomm'.*received PRODUCT \(rank 0\)",
        ):
            dist.all_reduce(torch.ones(2), op=dist.ReduceOp.PRODUCT)
    finally:
        dist.destroy_process_group()
        commlayer.unregister_backend("storecomm-errors")


def test_torch_reduce_op_values_are_accepted(world_of_one: None) -> None:
    tensor = torch.tensor([1.0, 5.0])
    dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)
    assert torch.equal(tensor, torch.tensor([1.0, 5.0]))


def test_bad_split_sizes(world_of_one: None) -> None:
    with pytest.raises(
        InvalidArgumentError,
        match=r"all_to_all_single: argument 'input_split_sizes' expected 1 non-negative ints summing to dim 0 \(4\), received \[1, 3\]",
    ):
        dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [4], [1, 3])


def test_bad_group_ranks(world_of_one: None) -> None:
    with pytest.raises(
        InvalidArgumentError,
        match=r"new_group: argument 'ranks' expected distinct ints in \[0, 1\), received \[0, 0\]",
    ):
        dist.new_group([0, 0])
    with pytest.raises(InvalidArgumentError, match="argument 'group' expected a commlayer ProcessGroup"):
        dist.all_reduce(torch.ones(1), group="world")


def test_malformed_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "RANK": "zero",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RendezvousEnvError, match="RANK: expected"):
        dist.init_process_group("gloo")
    assert not dist.is_initialized()


def test_missing_launcher_for_a_multi_rank_world(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(
        InvalidArgumentError,
        match="init_process_group: argument 'init_method' expected a launcher environment",
    ):
        dist.init_process_group("gloo", world_size=2, rank=0)


def test_single_process_needs_no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group("gloo")
    try:
        assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (0, 1, "gloo")
    finally:
        dist.destroy_process_group()


def test_torch_arguments_without_effect_are_logged_once(
    world_of_one: None, caplog: pytest.LogCaptureFixture
) -> None:
    from commlayer.facade.calls import ignored_arguments

    ignored_arguments._logged.clear()
    with caplog.at_level("WARNING", logger="commlayer.dist"):
        dist.barrier(device_ids=[0])
        dist.barrier(device_ids=[0])
        dist.new_group([0], group_desc="experts", use_local_synchronization=True)
    messages = [record.getMessage() for record in caplog.records]
    assert sum("barrier: argument 'device_ids'=[0] is accepted but has no effect" in m for m in messages) == 1
    assert any("new_group: argument 'group_desc'='experts'" in m for m in messages), messages
    assert any("new_group: argument 'use_local_synchronization'=True" in m for m in messages), messages
