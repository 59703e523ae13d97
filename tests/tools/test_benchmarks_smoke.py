"""Every benchmark script runs: each CPU benchmark at tiny sizes, each GPU-only one compiles.

A smoke test, not a measurement: the figures a tiny run prints mean nothing, only that the script
gets from its arguments to its last line. The selected CPU runs start together, a few at a time
(most of a tiny run is process start-up and rendezvous waits), each under a timeout; GPU-only
scripts and the helpers are compiled, shell scripts are parsed by bash.
"""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from commlayer.testing.cluster import cluster_unavailable_reason
from commlayer.testing.cluster_ssh import sshd_unavailable_reason
from commlayer.testing.mpi import mpirun_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
DATA = BENCHMARKS / "data"
TIMEOUT_S = 120
PARALLEL_RUNS = 3
QUICK_TEST = (
    "tests/reliability/test_mismatch_shared_slots.py::test_agreeing_ranks_get_none_and_slots_alternate"
)


def _needs_mpi() -> str | None:
    return mpirun_unavailable_reason()


def _needs_ccl() -> str | None:
    from commlayer.backends.ccl.locate import find_oneccl

    return None if find_oneccl(require_headers=True) else "oneCCL headers not found"


def _needs_namespaces() -> str | None:
    return cluster_unavailable_reason() or sshd_unavailable_reason()


# script -> (arguments of a tiny run, what it needs beyond this Python: a reason to skip or None)
CPU_RUNS: dict[str, tuple[list[str], object]] = {
    "overhead/facade_dispatch.py": (["--iters", "20", "--repeats", "1"], None),
    "overhead/comms_logger.py": (["--calls", "100", "--rounds", "1"], None),
    "overhead/recorder_and_debug_checks.py": (
        ["--iters", "20", "--repeats", "1", "--debug-iters", "2"],
        None,
    ),
    "overhead/profiler_and_hooks.py": (["--iters", "20", "--repeats", "1"], None),
    "overhead/shm_call_cost.py": (["--iters", "20", "--repeats", "1"], None),
    "overhead/torch_vs_commlayer.py": (["--standin", "--rounds", "1", "--iters", "1"], None),
    "overhead/torch_bridge.py": (["--calls", "10", "--repeats", "1", "--skip-ddp"], _needs_mpi),
    "overhead/mismatch_checks.py": (["--iters", "10", "--repeats", "1", "--max-bytes", "8"], _needs_mpi),
    "overhead/mpi_vs_mpi4py.py": (
        ["--world-sizes", "2", "--pairs", "default", "--variants", "mpi", "--rounds", "1"]
        + ["--budget", "0.001", "--max-bytes", "8", "--timeout", "100"],
        _needs_mpi,
    ),
    "cpu/ccl_vs_oneccl.py": (
        ["--worlds", "2", "--rounds", "1", "-e", "8", "--iters", "1", "--warmup", "0", "--backends", "ccl"],
        _needs_ccl,
    ),
    "faults/gloo_mismatch_detection.py": (["--modes", "on", "--ops", "all_reduce", "--kinds", "count"], None),
    "faults/repeated_tests.py": (["--runs", "1", "--batch", "1", "--tests", QUICK_TEST], None),
    "cpu/multihost.py": (
        ["--max-bytes", "8", "--ops", "all_reduce", "--backends", "gloo", "--configs", "two-hosts"],
        _needs_namespaces,
    ),
    "cpu/shm_targets.py": ([str(DATA / "cpu_collectives" / "vm.json"), "--run", "4 ranks"], None),
    "gpu/zero_report.py": ([str(DATA / "zero_training" / "2xh200.json")], None),
    "gpu/peermem_report.py": ([str(DATA / "gpu_collectives" / "4xh200.json")], None),
    "gpu/frameworks_report.py": ([str(DATA / "frameworks" / "2xh200.jsonl")], None),
}
# Scripts that need a GPU (or several), a fault-injection job of minutes under torchrun or
# torchft, or a training framework (the frameworks tier runs those): compiled only.
GPU_ONLY = (
    "cpu/frameworks.py",
    "gpu/bridge_check.py",
    "gpu/torchtitan_assets.py",
    "gpu/torchtitan_run.py",
    "gpu/compile.py",
    "faults/fault_injection.py",
    "gpu/parallel_layers.py",
    "gpu/peermem_conformance.py",
    "gpu/peermem_host_path.py",
    "gpu/peermem_profile.py",
    "gpu/peermem_shared_gpu.py",
    "gpu/peermem.py",
    "gpu/peermem_tp.py",
    "faults/peermem_timeout_gpu.py",
    "faults/torchrun_restart.py",
    "faults/torchft_baseline.py",
    "gpu/zero.py",
)


# Modules the scripts import; they run nothing themselves and are compiled only.
HELPERS = (
    "gpu/graph_timing.py",
    "gpu/peermem_checks.py",
    "gpu/stream_profile.py",
    "gpu/timed_steps.py",
    "overhead/mpi_report.py",
    "overhead/standin.py",
    "overhead/timed_ops.py",
    "overhead/torch_bridge_costs.py",
)


def _scripts(suffix: str) -> list[str]:
    """Every script under benchmarks/, as its path below that folder."""
    return sorted(str(path.relative_to(BENCHMARKS)) for path in BENCHMARKS.glob(f"*/*{suffix}"))


def _skip_reason(script: str) -> str | None:
    needs = CPU_RUNS[script][1]
    return needs() if callable(needs) else None


def _run(script: str, out: Path) -> subprocess.CompletedProcess:
    arguments = CPU_RUNS[script][0]
    if script in ("faults/repeated_tests.py", "cpu/multihost.py"):
        arguments = [*arguments, "--out", str(out / Path(script).stem)]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    command = [sys.executable, str(BENCHMARKS / script), *arguments]
    return subprocess.run(
        command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


@pytest.fixture(scope="module")
def cpu_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The selected scripts' tiny runs, started together: script -> the Future of its process."""
    selected = {
        item.callspec.params["script"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_cpu_benchmark_runs_at_tiny_sizes"
    }
    runnable = [script for script in sorted(selected) if _skip_reason(script) is None]
    out = tmp_path_factory.mktemp("benchmarks")
    pool = ThreadPoolExecutor(PARALLEL_RUNS)
    try:
        yield {script: pool.submit(_run, script, out) for script in runnable}
    finally:
        pool.shutdown(cancel_futures=True)  # a failed run need not wait for the ones not started


def test_every_benchmark_script_has_a_smoke_run() -> None:
    """A new benchmark script gets a tiny run here (or a place among the GPU-only scripts)."""
    assert set(_scripts(".py")) - set(HELPERS) == set(CPU_RUNS) | set(GPU_ONLY)


@pytest.mark.parametrize("script", sorted(CPU_RUNS))
def test_cpu_benchmark_runs_at_tiny_sizes(script: str, cpu_runs: dict[str, Future]) -> None:
    reason = _skip_reason(script)
    if reason:
        pytest.skip(reason)
    result = cpu_runs[script].result()
    output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{output}"
    assert result.stdout.strip(), f"{script} printed nothing"


@pytest.mark.parametrize("script", [*GPU_ONLY, *HELPERS])
def test_gpu_benchmark_and_helper_compile(script: str, tmp_path: Path) -> None:
    py_compile.compile(str(BENCHMARKS / script), cfile=str(tmp_path / "compiled.pyc"), doraise=True)


@pytest.mark.parametrize("script", _scripts(".sh"))
def test_benchmark_shell_script_parses(script: str) -> None:
    result = subprocess.run(
        ["bash", "-n", str(BENCHMARKS / script)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
