"""Tier 1: choosing and parsing backends is a pure function of its inputs."""

from __future__ import annotations

import pytest

from commlayer.contract.selection import BACKEND_ENV, parse_backend_spec, resolve_backend_spec
from commlayer.core.errors import InvalidArgumentError

DEVICES = {"gloo": ["cpu"], "nccl": ["cuda"], "mpi": ["cpu", "cuda"], "ccl": ["cpu", "xpu"]}


@pytest.mark.parametrize(
    ("accelerator", "expected"),
    [
        ("cpu", "shm"),
        ("cuda", "cpu:gloo,cuda:peermem"),
        ("xpu", "cpu:gloo,xpu:ccl"),
        ("npu", "cpu:gloo,npu:hccl"),
    ],
)
def test_default_follows_the_accelerator(accelerator: str, expected: str) -> None:
    assert resolve_backend_spec(None, {}, accelerator) == expected


def test_environment_overrides_the_automatic_choice_only() -> None:
    env = {BACKEND_ENV: "MPI"}
    assert resolve_backend_spec(None, env, "cuda") == "mpi"
    assert resolve_backend_spec("gloo", env, "cuda") == "gloo"
    assert resolve_backend_spec("undefined", env, "cpu") == "mpi"


def test_only_the_automatic_choice_falls_back_to_gloo_where_shm_cannot_run() -> None:
    no_shm = lambda name: name != "shm"
    assert resolve_backend_spec(None, {}, "cpu", no_shm) == "gloo"
    assert resolve_backend_spec("shm", {}, "cpu", no_shm) == "shm"  # asked for: fails loudly later
    assert resolve_backend_spec(None, {BACKEND_ENV: "shm"}, "cpu", no_shm) == "shm"
    assert resolve_backend_spec(None, {}, "cuda", no_shm) == "cpu:gloo,cuda:peermem"


def test_unknown_accelerator_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match="no default backend for accelerator 'tpu'"):
        resolve_backend_spec(None, {}, "tpu")


def test_bare_name_serves_every_device_of_its_backend() -> None:
    assert parse_backend_spec("mpi", DEVICES.__getitem__) == {"cpu": "mpi", "cuda": "mpi"}


def test_torch_style_device_map() -> None:
    assert parse_backend_spec("cpu:gloo,cuda:nccl", DEVICES.__getitem__) == {"cpu": "gloo", "cuda": "nccl"}
    assert parse_backend_spec(" cpu:gloo , xpu:ccl ", DEVICES.__getitem__) == {"cpu": "gloo", "xpu": "ccl"}


@pytest.mark.parametrize("spec", ["cpu:gloo,cpu:mpi", "cpu:,cuda:nccl", ":gloo", "cpu:gloo,cuda"])
def test_malformed_device_map(spec: str) -> None:
    with pytest.raises(InvalidArgumentError, match="argument 'backend'"):
        parse_backend_spec(spec, DEVICES.__getitem__)
