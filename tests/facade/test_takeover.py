"""The zero-change switch (``COMMLAYER_TORCH_TAKEOVER``): what it takes over, that ``import torch``
installs it only when it is on, and what torch's own calls then build."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as torch_dist

from commlayer.contract import takeover
from commlayer.facade.torch_bridge.process_group import CommlayerProcessGroup


@pytest.mark.parametrize(
    ("backend", "taken"),
    [
        (None, True),
        ("", True),
        ("undefined", True),
        ("gloo", True),
        ("NCCL", True),
        ("cpu:gloo,cuda:nccl", True),
        ("cuda:nccl,cpu:gloo", True),
        ("commlayer", False),
        ("mpi", False),
        ("cpu:gloo,cuda:peermem", False),
        ("cpu:mpi,cuda:nccl", False),
        ("xccl", False),
    ],
)
def test_takes_over_torchs_gloo_nccl_and_no_backend_only(backend: str | None, taken: bool) -> None:
    assert takeover.taken_over(backend) is taken


def _installed_after_import_torch(value: str | None) -> str:
    env = {key: item for key, item in os.environ.items() if key != takeover.TAKEOVER_ENV}
    if value is not None:
        env[takeover.TAKEOVER_ENV] = value
    probe = (
        "import torch, torch.distributed as d, torch.distributed.distributed_c10d as c; "
        "print([hasattr(f, 'commlayer_original') for f in "
        "(d.init_process_group, d.new_group, c.init_process_group, c.new_group)])"
    )
    return subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()


def test_import_torch_changes_nothing_unless_the_switch_is_on() -> None:
    assert _installed_after_import_torch(None) == "[False, False, False, False]"
    assert _installed_after_import_torch("0") == "[False, False, False, False]"
    assert _installed_after_import_torch("1") == "[True, True, True, True]"


@pytest.fixture
def switched_on() -> Iterator[None]:
    takeover.install()
    try:
        yield
    finally:
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()
        takeover.uninstall()
    assert not takeover.installed()


def test_torch_gloo_groups_are_commlayers_under_the_switch(switched_on: None) -> None:
    torch_dist.init_process_group(
        "gloo", store=torch_dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20)
    )
    assert isinstance(torch_dist.group.WORLD, CommlayerProcessGroup)
    assert torch_dist.get_backend() == "commlayer"
    subgroup = torch_dist.new_group([0], backend="gloo")
    assert isinstance(subgroup, CommlayerProcessGroup)
    assert torch_dist.get_backend(subgroup) == "commlayer"
