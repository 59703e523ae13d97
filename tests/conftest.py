"""Shared fixtures. Multi-rank tests go through commlayer.testing.run_world; these are in-process."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as torch_dist

from commlayer import dist
from commlayer.core.shm_files import release_dead_regions

REPO = Path(__file__).resolve().parent.parent
PLUGIN_DIR = REPO / "examples" / "plugin"


@pytest.fixture
def world_of_one() -> Iterator[None]:
    """An initialised single-rank gloo world in this process, torn down afterwards."""
    dist.init_process_group(
        "gloo", store=torch_dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20)
    )
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.fixture
def storecomm_module() -> Iterator[object]:
    """The example third-party backend's module, importable from its source folder."""
    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        import commlayer_storecomm

        yield commlayer_storecomm
    finally:
        sys.path.remove(str(PLUGIN_DIR))


@pytest.fixture(autouse=True)
def _no_stale_shared_memory() -> Iterator[None]:
    """Remove what killed ranks left in /dev/shm before and after each test: those of this test,
    and those of processes that died outside any test (an interrupted run, a rank that outlived
    its test), whose pids a later rank may be given (see commlayer.core.shm_files)."""
    release_dead_regions()
    yield
    release_dead_regions()


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Give each test the environment the previous one started with.

    An in-process ``init_process_group`` adds the interface variables of commlayer.core.netif
    (``GLOO_SOCKET_IFNAME=lo`` for a loopback master, ...) to ``os.environ`` on purpose, since the
    backends read them there; left behind, they steer the ranks of later tests, e.g. pinning the
    ranks of a multi-host test to ``lo``, where they never meet.
    """
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
