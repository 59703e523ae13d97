"""Wiring: the registry finds the built-in backends through entry points and explains failures."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as torch_dist

import commlayer
from commlayer import dist
from commlayer.core.errors import BackendUnavailableError


def test_builtin_backends_come_from_entry_points() -> None:
    rows = {info.name: info for info in commlayer.list_backends()}
    assert {"gloo", "nccl", "mpi", "ccl", "hccl"} <= set(rows)
    assert rows["gloo"].origin == "commlayer.backends.gloo:GlooBackend"
    assert rows["gloo"].availability.available


def test_duplicate_name_is_rejected() -> None:
    gloo = commlayer.get_backend_class("gloo")
    with pytest.raises(
        ValueError, match="backend 'gloo' is already registered by commlayer.backends.gloo:GlooBackend"
    ):
        commlayer.register_backend("gloo", gloo)


def test_register_rejects_non_backends() -> None:
    with pytest.raises(TypeError, match="expected a Backend subclass"):
        commlayer.register_backend("nonsense", object)  # type: ignore[arg-type]


def test_unknown_backend_is_one_line_naming_the_closest_and_the_installed_ones() -> None:
    with pytest.raises(BackendUnavailableError) as caught:
        commlayer.get_backend_class("glo")
    message = str(caught.value)
    assert "\n" not in message, message
    assert message.startswith(
        "backend 'glo' names no installed backend (did you mean 'gloo'?); installed: "
    ), message
    assert all(name in message for name in ("ccl", "gloo", "hccl", "mpi", "nccl", "shm")), message


@pytest.mark.skipif(torch.cuda.is_available(), reason="nccl runs on this host")
def test_unavailable_backend_is_one_line_with_its_reason() -> None:
    with pytest.raises(BackendUnavailableError) as caught:
        commlayer.get_backend_class("nccl")
    assert str(caught.value) == (
        "backend 'nccl' cannot run on this host: no CUDA device is visible (torch.cuda.is_available() is False)"
    )


def test_unknown_backend_fails_init_before_any_rendezvous() -> None:
    with pytest.raises(BackendUnavailableError, match="'nope' names no installed backend"):
        dist.init_process_group("nope", store=torch_dist.HashStore(), rank=0, world_size=1)
    assert not dist.is_initialized()


def test_run_time_registration_is_used_end_to_end(storecomm_module: object) -> None:
    commlayer.register_backend("storecomm-runtime", storecomm_module.StoreBackend)  # type: ignore[attr-defined]
    try:
        dist.init_process_group("storecomm-runtime", store=torch_dist.HashStore(), rank=0, world_size=1)
        tensor = torch.arange(4.0)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        dist.reduce_scatter_tensor(out := torch.zeros(4), tensor)  # a generic fallback
        assert torch.equal(out, torch.arange(4.0)) and dist.get_backend() == "storecomm-runtime"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        commlayer.unregister_backend("storecomm-runtime")
