"""The ccl backend's pure logic and wiring, in this process (multi-rank runs are in test_ccl.py).

Pure logic: where oneCCL is looked for, which environment is set, store keys, split counts, the
first-use build's plan and cache. Wiring: the entry point, declared capabilities, availability
and its reason when the extension is missing, backend selection, the extension's argument checks.
"""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from commlayer.backends.ccl import INSTALL_HINT, CclBackend
from commlayer.backends.ccl import native as _native
from commlayer.backends.ccl.backend import _element_counts, _unflatten_into
from commlayer.backends.ccl.bootstrap import GroupKeys, printable
from commlayer.backends.ccl.build import (
    CACHE_ENV,
    BuildPlan,
    BuildUnavailable,
    build_plan,
    cache_root,
    cached_extension,
)
from commlayer.backends.ccl.environment import HostLayout, oneccl_defaults
from commlayer.backends.ccl.locate import OneCclInstall, candidate_prefixes, find_oneccl
from commlayer.contract.registry import get_backend_class, list_backends
from commlayer.contract.selection import resolve_backend_spec
from commlayer.core.types import ReduceOp
from commlayer.testing.conformance import NUMERIC_DTYPES

HAS_EXTENSION = importlib.util.find_spec(_native.EXTENSION) is not None


def _fake_prefix(root: Path, headers: bool) -> Path:
    """A directory laid out like a oneCCL install (empty files: only the layout is inspected)."""
    (root / "lib" / "libfabric" / "prov").mkdir(parents=True)
    (root / "lib" / "libccl.so.1").touch()
    (root / "lib" / "libfabric" / "libfabric.so.1").touch()
    if headers:
        (root / "include" / "oneapi").mkdir(parents=True)
        (root / "include" / "oneapi" / "ccl.hpp").touch()
    return root


# --- locating oneCCL -------------------------------------------------------------------------


def test_ccl_root_is_searched_first_and_prefixes_are_unique(tmp_path: Path) -> None:
    prefixes = candidate_prefixes({"CCL_ROOT": str(tmp_path), "ONEAPI_ROOT": str(tmp_path / "oneapi")})
    assert prefixes[:2] == [tmp_path, tmp_path / "oneapi" / "ccl" / "latest"]
    assert len(prefixes) == len(set(prefixes))


def test_find_oneccl_prefers_ccl_root_and_reports_its_layout(tmp_path: Path) -> None:
    root = _fake_prefix(tmp_path / "ccl", headers=True)
    install = find_oneccl(require_headers=True, environ={"CCL_ROOT": str(root)})
    assert install == OneCclInstall(prefix=root, lib_dir=root / "lib", include_dir=root / "include")
    assert install.library == root / "lib" / "libccl.so.1"
    assert install.libfabric_provider_dir == root / "lib" / "libfabric" / "prov"


def test_a_runtime_only_prefix_does_not_satisfy_the_build(tmp_path: Path) -> None:
    root = _fake_prefix(tmp_path / "runtime", headers=False)
    runtime = find_oneccl(require_headers=False, environ={"CCL_ROOT": str(root)})
    assert runtime is not None and runtime.prefix == root and runtime.include_dir is None
    for_build = find_oneccl(require_headers=True, environ={"CCL_ROOT": str(root)})
    assert for_build is None or for_build.prefix != root


# --- the environment oneCCL gets -------------------------------------------------------------


ROOMY_HOST = HostLayout(local_rank=None, local_size=2, cpus=64)


def test_defaults_cover_transport_provider_paths_and_timeouts(tmp_path: Path) -> None:
    root = _fake_prefix(tmp_path, headers=False)
    install = OneCclInstall(root, root / "lib", None)
    added = oneccl_defaults({}, install, timedelta(seconds=2.5), ROOMY_HOST)
    assert added == {
        "CCL_ATL_TRANSPORT": "ofi",
        "FI_PROVIDER": "tcp",
        "CCL_LOG_LEVEL": "error",
        "CCL_KVS_CONNECTION_TIMEOUT": "2",
        "CCL_KVS_GET_TIMEOUT": "2",
        "FI_PROVIDER_PATH": str(root / "lib" / "libfabric" / "prov"),
        "CCL_OFI_LIBRARY_PATH": str(root / "lib" / "libfabric" / "libfabric.so.1"),
    }


def test_defaults_never_override_what_the_user_set() -> None:
    user = {"CCL_ATL_TRANSPORT": "mpi", "FI_PROVIDER": "shm", "CCL_KVS_CONNECTION_TIMEOUT": "100"}
    added = oneccl_defaults(user, None, timedelta(minutes=30), ROOMY_HOST)
    assert not set(user) & set(added)
    assert added["CCL_KVS_GET_TIMEOUT"] == "1440"


def test_the_launchers_local_layout_is_passed_on() -> None:
    added = oneccl_defaults({}, None, timedelta(seconds=1), HostLayout(local_rank=1, local_size=4, cpus=64))
    assert (added["CCL_LOCAL_RANK"], added["CCL_LOCAL_SIZE"]) == ("1", "4")


def test_worker_threads_are_dropped_only_on_an_oversubscribed_host() -> None:
    one_second = timedelta(seconds=1)
    assert "CCL_WORKER_OFFLOAD" not in oneccl_defaults({}, None, one_second, HostLayout(0, 4, cpus=8))
    assert oneccl_defaults({}, None, one_second, HostLayout(0, 2, cpus=2))["CCL_WORKER_OFFLOAD"] == "0"
    user_choice = {"CCL_WORKER_OFFLOAD": "1"}
    assert "CCL_WORKER_OFFLOAD" not in oneccl_defaults(
        user_choice, None, one_second, HostLayout(0, 2, cpus=2)
    )


# --- store keys, addresses, splits -----------------------------------------------------------


def test_each_incarnation_of_a_group_gets_fresh_keys() -> None:
    first, second = GroupKeys.next_for("unit-test-group"), GroupKeys.next_for("unit-test-group")
    assert first.address != second.address and first.joined(1) != second.joined(1)
    assert first.address.startswith("unit-test-group/") and first.closed(2).endswith("/closed/2")


def test_printable_address_drops_the_nul_padding() -> None:
    assert printable(b"10.0.0.7_41234".ljust(256, b"\0")) == "10.0.0.7_41234"


def test_element_counts_turn_row_splits_into_per_rank_elements() -> None:
    rows_of_three = torch.zeros(6, 3)
    assert _element_counts(rows_of_three, [1, 0, 5], 3) == [3, 0, 15]
    assert _element_counts(rows_of_three, None, 3) == [6, 6, 6]
    assert _element_counts(torch.zeros(0, 3), [0, 0], 2) == [0, 0]


def test_unflatten_fills_each_output_in_order() -> None:
    outputs = [torch.zeros(2), torch.zeros(1, 3), torch.zeros(0)]
    _unflatten_into(torch.arange(5.0), outputs)
    assert outputs[0].tolist() == [0.0, 1.0] and outputs[1].tolist() == [[2.0, 3.0, 4.0]]


# --- wiring ----------------------------------------------------------------------------------


def test_declared_capabilities_are_the_issue_contract() -> None:
    caps = CclBackend.capabilities
    assert set(NUMERIC_DTYPES) <= caps.dtypes
    assert torch.bool not in caps.dtypes  # oneCCL has no boolean type
    assert caps.reduce_ops == {ReduceOp.SUM, ReduceOp.AVG, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT}
    assert caps.devices == {"cpu"} and not caps.recv_any_source


def test_ccl_is_selected_by_the_environment_variable_and_by_xpu() -> None:
    assert resolve_backend_spec(None, {"COMMLAYER_BACKEND": "ccl"}, "cpu") == "ccl"
    assert "xpu:ccl" in resolve_backend_spec(None, {}, "xpu")
    assert resolve_backend_spec(None, {}, "cpu") == "shm"


def test_missing_extension_is_reported_with_reason_and_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_native, "EXTENSION", "commlayer.backends.ccl._not_built")
    monkeypatch.setenv("CXX", "commlayer-no-such-compiler")  # nor can it be built on first use
    availability = CclBackend.is_available()
    assert not availability
    assert "not built" in availability.reason and "_not_built" in availability.reason
    assert "no C++ compiler (commlayer-no-such-compiler)" in availability.reason
    assert availability.install_hint == INSTALL_HINT
    assert "pip install" in INSTALL_HINT and "'commlayer[ccl]'" in INSTALL_HINT
    assert "--no-build-isolation" in INSTALL_HINT


@pytest.mark.skipif(find_oneccl(require_headers=True) is None, reason="oneCCL's headers are not installed")
def test_missing_extension_that_can_be_built_is_available_with_where_it_will_be_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_native, "EXTENSION", "commlayer.backends.ccl._not_built")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    availability = CclBackend.is_available()
    assert availability and "compiles on first use" in availability.reason
    assert f"into {tmp_path / 'ccl'}" in availability.reason and not any(tmp_path.iterdir())


# --- the first-use build -----------------------------------------------------------------------


def test_build_plan_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(BuildUnavailable, match="oneCCL is not installed"):
        build_plan(None)
    runtime_only = OneCclInstall(tmp_path, tmp_path / "lib", include_dir=None)
    with pytest.raises(BuildUnavailable, match=rf"oneCCL at {tmp_path} has no headers \(oneccl-cpu-devel\)"):
        build_plan(runtime_only)


def test_build_cache_key_follows_source_and_versions_and_lives_under_the_cache_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source = tmp_path / "binding.cpp"
    source.write_text("// one")
    install = OneCclInstall(tmp_path, tmp_path / "lib", tmp_path / "include")
    plan = BuildPlan(source, "c++", ("/pybind11", str(install.include_dir)), install, "oneccl-cpu==1")
    key = plan.key
    assert BuildPlan(source, "c++", plan.include_dirs, install, "oneccl-cpu==2").key != key
    source.write_text("// two")
    assert plan.key != key
    assert f"-Wl,-rpath,{tmp_path / 'lib'}" in plan.command(tmp_path / "out.so")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert plan.target.parent == tmp_path / "cache" / "ccl" / plan.key
    assert cached_extension(plan) is None
    assert cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/commlayer")
    assert cache_root({CACHE_ENV: "/y", "XDG_CACHE_HOME": "/x"}) == Path("/y")


@pytest.mark.ccl
@pytest.mark.skipif(not HAS_EXTENSION, reason="the oneCCL extension is not built")
def test_entry_point_registers_an_available_ccl() -> None:
    assert get_backend_class("ccl") is CclBackend
    (info,) = [info for info in list_backends() if info.name == "ccl"]
    assert info.availability, info.availability.reason
    assert info.origin == "commlayer.backends.ccl:CclBackend"


@pytest.mark.ccl
@pytest.mark.skipif(not HAS_EXTENSION, reason="the oneCCL extension is not built")
def test_extension_rejects_bad_arguments_before_calling_oneccl() -> None:
    native = _native.load_extension()
    with pytest.raises(ValueError, match="'address' must be exactly 256 bytes"):
        native.create_kvs(b"127.0.0.1_1")
    assert native.ADDRESS_SIZE == 256
    types = _native.NativeTypes.of(native)
    assert (types.datatypes[torch.bfloat16].name, types.datatypes[torch.uint8].name) == ("bfloat16", "uint8")
    assert types.reductions[ReduceOp.SUM].name == "sum" and types.reductions[ReduceOp.PRODUCT].name == "prod"
    assert ReduceOp.AVG not in types.reductions  # the facade averages: SUM, then a division
