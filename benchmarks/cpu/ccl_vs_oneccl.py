"""commlayer's ccl backend against a raw oneCCL C++ program, gloo and mpi: all_reduce, 8 B .. 64 MiB.

One command builds the reference program, runs every job and prints the tables::

    python benchmarks/cpu/ccl_vs_oneccl.py --worlds 2,4 --rounds 3 --json ccl_results.json

Per world size and round (the order of the two jobs alternates between rounds, so drift on a shared
host hits both alike):

    raw-wait    csrc/bench/ccl_allreduce_bench.cpp, plain oneCCL C++ built here with the venv's
                headers and libraries, run with exactly the environment the ccl backend sets,
                waiting with ccl::event::wait()
    raw-poll    the same program waiting as commlayer's binding does (test() + yield), which
                separates the cost of the binding from the choice of wait loop
    ccl, gloo, mpi   ``commlayer bench --ops all_reduce`` with all three backends in one mpirun job
                (without a usable mpirun: a local launch of ccl and gloo only)

Both sides time the same thing: in-place float32 SUM, warm-up ops, a barrier, then blocking ops;
a rank's figure is its mean per op, the job's is the slowest rank's; every result is checked once.
Reported: the best round (load from other processes only adds time); the JSON keeps the median.
"ccl vs raw" is the best raw variant's time over ccl's (>= 1: ccl is as fast).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

from commlayer.backends.ccl.environment import HostLayout, oneccl_defaults, usable_cpus
from commlayer.backends.ccl.locate import OneCclInstall, find_oneccl
from commlayer.core.metrics import parse_size, size_sweep
from commlayer.testing.mpi import mpirun_plan, mpirun_unavailable_reason

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "csrc" / "bench" / "ccl_allreduce_bench.cpp"
PROGRAM = REPO / "build" / "ccl_bench" / "ccl_allreduce_bench"
RAW_VARIANTS = {"raw-wait": "native", "raw-poll": "poll"}  # variant -> the program's --wait
GOAL_RATIO, GOAL_FROM_BYTES = 0.95, 1 << 20
JOB_TIMEOUT_S = 900


@dataclass(frozen=True)
class Settings:
    worlds: tuple[int, ...]
    rounds: int
    min_bytes: int
    max_bytes: int
    factor: float
    iters: int
    warmup: int
    backends: str = "ccl,gloo,mpi"


@dataclass(frozen=True)
class Sample:
    world_size: int
    variant: str  # raw-wait | raw-poll | ccl | gloo | mpi
    nbytes: int
    time_us: float


def main() -> None:
    settings, json_path = _parse()
    install = find_oneccl(require_headers=True)
    if install is None:
        sys.exit("ccl_vs_oneccl: oneCCL headers not found; pip install 'commlayer[ccl]' first")
    build_program(install)
    started = _machine()
    samples: list[Sample] = []
    for round_index in range(settings.rounds):
        for world_size in settings.worlds:
            jobs = [
                functools.partial(run_raw, world_size, settings, install, "raw-wait"),
                functools.partial(run_commlayer, world_size, settings),
                functools.partial(run_raw, world_size, settings, install, "raw-poll"),
            ]
            for job in jobs if round_index % 2 == 0 else jobs[::-1]:
                samples += job()
            print(
                f"round {round_index + 1}/{settings.rounds}, {world_size} ranks: done",
                file=sys.stderr,
                flush=True,
            )
    report = {
        "machine": started,
        "finished_load": os.getloadavg(),
        "settings": asdict(settings),
        "environment": _ccl_environment(install, 2),
        "rows": summarize(samples),
    }
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=1) + "\n")
    print(markdown(report))


# --- the reference program -------------------------------------------------------------------


def build_program(install: OneCclInstall) -> None:
    """Compile the raw oneCCL program unless an up-to-date binary exists."""
    if PROGRAM.exists() and PROGRAM.stat().st_mtime > SOURCE.stat().st_mtime:
        return
    PROGRAM.parent.mkdir(parents=True, exist_ok=True)
    command = [
        "g++",
        "-O2",
        "-std=c++17",
        f"-I{install.include_dir}",
        str(SOURCE),
        f"-L{install.lib_dir}",
        "-lccl",
        f"-Wl,-rpath,{install.lib_dir}",
        "-o",
        str(PROGRAM),
    ]
    subprocess.run(command, check=True)


def run_raw(world_size: int, settings: Settings, install: OneCclInstall, variant: str) -> list[Sample]:
    with tempfile.TemporaryDirectory(prefix="ccl-raw-") as directory:
        arguments = [
            str(PROGRAM),
            "--kvs-file",
            str(Path(directory) / "kvs.address"),
            "--wait",
            RAW_VARIANTS[variant],
            "--min-bytes",
            str(settings.min_bytes),
            "--max-bytes",
            str(settings.max_bytes),
            "--factor",
            str(int(settings.factor)),
            "--iters",
            str(settings.iters),
            "--warmup",
            str(settings.warmup),
        ]
        ranks = [
            subprocess.Popen(
                arguments, env=_raw_env(install, rank, world_size), stdout=subprocess.PIPE, text=True
            )
            for rank in range(world_size)
        ]
        outputs = [rank.communicate(timeout=JOB_TIMEOUT_S)[0] for rank in ranks]
    if any(rank.returncode for rank in ranks):
        raise RuntimeError(f"{variant} failed with exit codes {[rank.returncode for rank in ranks]}")
    rows = [json.loads(line) for line in outputs[0].splitlines() if line.startswith("{")]
    _require_correct(variant, rows)
    return [Sample(world_size, variant, row["bytes"], row["time_us"]) for row in rows]


def _raw_env(install: OneCclInstall, rank: int, world_size: int) -> dict[str, str]:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size)}
    host = HostLayout(local_rank=rank, local_size=world_size, cpus=usable_cpus())
    return {**env, **oneccl_defaults(env, install, timedelta(seconds=JOB_TIMEOUT_S), host)}


def _ccl_environment(install: OneCclInstall, world_size: int) -> dict[str, str]:
    """What the backend (and so the raw program) adds to the environment, for the record."""
    host = HostLayout(local_rank=0, local_size=world_size, cpus=usable_cpus())
    return oneccl_defaults(os.environ, install, timedelta(seconds=JOB_TIMEOUT_S), host)


# --- commlayer bench ---------------------------------------------------------------------------


def run_commlayer(world_size: int, settings: Settings) -> list[Sample]:
    backends = settings.backends
    if mpirun_unavailable_reason():
        backends = ",".join(name for name in backends.split(",") if name != "mpi")
    with tempfile.TemporaryDirectory(prefix="ccl-compare-") as directory:
        output = Path(directory) / "bench.json"
        bench = [
            sys.executable,
            "-m",
            "commlayer.bench",
            "--backends",
            backends,
            "--ops",
            "all_reduce",
            "-b",
            str(settings.min_bytes),
            "-e",
            str(settings.max_bytes),
            "-f",
            str(settings.factor),
            "--iters",
            str(settings.iters),
            "--warmup",
            str(settings.warmup),
            "--json",
            str(output),
        ]
        command, env = _launch(bench, world_size)
        _run_job(command, env)
        data = json.loads(output.read_text())
    rows = data["records"] if isinstance(data, dict) else data
    _require_correct("commlayer bench", rows)
    return [Sample(world_size, row["backend"], row["bytes"], row["time_us"]) for row in rows]


def _run_job(command: list[str], env: dict[str, str]) -> None:
    """Runs one launch of ``commlayer.bench``; when it fails, raises with the ranks' last output."""
    result = subprocess.run(
        command,
        check=False,
        env=env,
        timeout=JOB_TIMEOUT_S,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-40:])
        raise RuntimeError(
            f"{' '.join(command[:4])} ... exited {result.returncode}; its ranks' last output:\n{tail}"
        )


def _launch(bench: list[str], world_size: int) -> tuple[list[str], dict[str, str]]:
    if mpirun_unavailable_reason():
        return [*bench, "-n", str(world_size)], dict(os.environ)
    # Unpinned ranks, like the raw program's and a local launch's: Intel MPI pins each rank to one
    # core by default, which starves gloo's helper threads.
    plan = mpirun_plan(world_size, {**os.environ, "I_MPI_PIN": os.environ.get("I_MPI_PIN", "0")})
    return [*plan.argv, *bench], dict(plan.env)


def _require_correct(what: str, rows: list[dict]) -> None:
    wrong = [row for row in rows if row.get("wrong")]
    if wrong:
        raise RuntimeError(f"{what} computed wrong results: {wrong}")


# --- report ------------------------------------------------------------------------------------


def summarize(samples: list[Sample]) -> list[dict]:
    """One row per (world size, bytes): best and median time of every variant, ratio, fastest."""
    keys = sorted({(sample.world_size, sample.nbytes) for sample in samples})
    rows = []
    for world_size, nbytes in keys:
        times: dict[str, list[float]] = {}
        for sample in samples:
            if (sample.world_size, sample.nbytes) == (world_size, nbytes):
                times.setdefault(sample.variant, []).append(sample.time_us)
        best = {variant: min(values) for variant, values in times.items()}
        raw_best = min((best[v] for v in RAW_VARIANTS if v in best), default=None)
        rows.append(
            {
                "world_size": world_size,
                "bytes": nbytes,
                "best_us": best,
                "median_us": {variant: statistics.median(values) for variant, values in times.items()},
                "ccl_vs_raw": raw_best / best["ccl"] if raw_best is not None and "ccl" in best else None,
                "fastest": min(best, key=best.get),
                "fastest_backend": min(
                    (v for v in best if v not in RAW_VARIANTS), key=best.get, default=None
                ),
            }
        )
    return rows


def markdown(report: dict) -> str:
    lines: list[str] = []
    for world_size in sorted({row["world_size"] for row in report["rows"]}):
        rows = [row for row in report["rows"] if row["world_size"] == world_size]
        variants = [
            v for v in (*RAW_VARIANTS, "ccl", "gloo", "mpi") if any(v in row["best_us"] for row in rows)
        ]
        lines += ["", f"all_reduce, float32 SUM, {world_size} ranks: time per op in us (best of rounds)", ""]
        lines.append("| bytes | " + " | ".join(variants) + " | ccl vs raw | fastest backend |")
        lines.append("|---:|" + "---:|" * len(variants) + "---:|---|")
        for row in rows:
            cells = [f"{row['best_us'][v]:.1f}" if v in row["best_us"] else "-" for v in variants]
            ratio = f"{row['ccl_vs_raw']:.2f}" if row["ccl_vs_raw"] is not None else "-"
            lines.append(
                f"| {_size(row['bytes'])} | " + " | ".join(cells) + f" | {ratio} | {row['fastest_backend']} |"
            )
        large = [row["ccl_vs_raw"] for row in rows if row["bytes"] >= GOAL_FROM_BYTES and row["ccl_vs_raw"]]
        if large:
            verdict = "met" if min(large) >= GOAL_RATIO else "NOT met"
            lines += [
                "",
                (
                    f"ccl vs raw at >= 1 MiB: min {min(large):.2f}, median {statistics.median(large):.2f} "
                    f"(goal {GOAL_RATIO}: {verdict})"
                ),
            ]
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _machine() -> dict:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu": model,
        "usable_cpus": usable_cpus(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _parse() -> tuple[Settings, Path | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", default="2,4", help="comma-separated world sizes (default 2,4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per world size (default 3)")
    parser.add_argument("-b", "--min-bytes", default="8")
    parser.add_argument("-e", "--max-bytes", default="64M")
    parser.add_argument("-f", "--factor", type=int, default=2, help="size multiplier (integer, default 2)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write samples and summary here")
    parser.add_argument("--backends", default="ccl,gloo,mpi", help="commlayer's side (mpi needs mpirun)")
    options = parser.parse_args()
    settings = Settings(
        tuple(int(n) for n in options.worlds.split(",")),
        options.rounds,
        parse_size(options.min_bytes),
        parse_size(options.max_bytes),
        float(options.factor),
        options.iters,
        options.warmup,
        options.backends,
    )
    size_sweep(settings.min_bytes, settings.max_bytes, settings.factor)  # validates the range
    return settings, options.json


if __name__ == "__main__":
    main()
