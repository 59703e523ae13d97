"""torch_vs_commlayer.py --standin: the facade's own cost per op, on torch's stand-in ProcessGroup.

torch's "fake" ProcessGroup (``torch.testing._internal.distributed.fake_pg``) completes every op
at once without communicating, so what is left is each wrapper's Python: raw ``torch.distributed``,
commlayer, and the bare ProcessGroup method with prebuilt options (the floor both sit on). One
process, world size 2, rank 0; each (op, mode) is timed in rounds that rotate the three, fastest
round per call. ``--before REF`` lays git commit REF's commlayer out in a temporary folder (as
``gpu_site.sh`` does on the GPU machine) and runs this measurement on it and on the current tree in
alternating child processes, ``--repeats`` times each, so both sides share the machine's state.
``--backend mpi`` or ``--backend ccl`` times those backends' facade cost instead, in a world of one
on the real library: the backend's own op (the floor) against the facade's, both waited.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import ModuleType

import tomllib
import torch
import torch.distributed as torch_dist
from timed_ops import trio

import commlayer
from commlayer import Capabilities, ReduceOp, dist

STANDIN_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all_single", "send", "recv")
REPO = Path(__file__).resolve().parents[2]


def per_call_us(calls: dict[str, object], iters: int, rounds: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        for _ in range(iters // 10):
            call()
    names = list(calls)
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            call = calls[name]
            start = time.perf_counter()
            for _ in range(iters):
                call()
            samples[name].append((time.perf_counter() - start) / iters * 1e6)
    # The fastest round: on a shared machine interference only ever adds time.
    return {name: min(values) for name, values in samples.items()}


def _in_layout(module: str, before_layers: str) -> ModuleType:
    """``module`` of the commlayer this process imports, or its name in a commit from before the
    layers were folders (``--before``): the working tree's editable install would otherwise
    answer the new name with the new module, of another commlayer than the one being measured."""
    layered = (Path(commlayer.__file__).parent / "core").is_dir()
    return importlib.import_module(module if layered else before_layers)


def measure(iters: int, rounds: int) -> list[dict]:
    """Rows of (op, mode, bare_us, raw_us, commlayer_us) for the commlayer this process imports."""
    import torch.testing._internal.distributed.fake_pg

    TorchBackend = _in_layout("commlayer.backends.torch_base", "commlayer.backends._torch").TorchBackend

    class StandInBackend(TorchBackend):  # type: ignore[misc,valid-type]
        name = torch_backend = "fake"
        capabilities = Capabilities(devices=frozenset({"cpu"}))

    commlayer.register_backend("fake", StandInBackend)
    warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 deprecates two spellings per call
    store = torch_dist.HashStore()
    store.set("commlayer/left/1", b"1")  # the absent rank 1 has "left": destroy need not wait for it
    dist.init_process_group("fake", store=store, rank=0, world_size=2)
    rows = []
    try:
        for op in STANDIN_OPS:
            for async_op in (False, True):
                calls = trio(op, 32, 2, 0, torch.device("cpu"), async_op)
                timed = {"bare": calls.bare, "raw": calls.raw, "commlayer": calls.commlayer}
                row = {"op": op, "mode": "async" if async_op else "sync"}
                rows.append(row | {f"{k}_us": v for k, v in per_call_us(timed, iters, rounds).items()})
        rows.append(_with_logger(iters, rounds))
    finally:
        dist.destroy_process_group()
    return rows


LIBRARY_OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all_single")


def measure_library(backend: str, iters: int, rounds: int) -> list[dict]:
    """Rows of (op, mode, bare_us, commlayer_us) in a world of one on ``backend`` (mpi, ccl): the
    backend's own op called directly (the floor) against the facade's, both waited. These
    backends have no torch wrapper to compare with: ``raw_us`` is NaN."""
    from commlayer import comms_logger

    resolve_group = _in_layout("commlayer.facade.groups.group", "commlayer.facade.groups").resolve_group
    dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1)
    rows = []
    try:
        library = resolve_group("bench", None).primary_backend
        for op in LIBRARY_OPS:
            for async_op in (False, True):
                timed = dict(zip(("bare", "commlayer"), _library_pair(op, library, async_op)))
                row = {"op": op, "mode": "async" if async_op else "sync", "raw_us": float("nan")}
                rows.append(row | {f"{k}_us": v for k, v in per_call_us(timed, iters, rounds).items()})
        comms_logger.enable()
        try:
            timed = dict(zip(("bare", "commlayer"), _library_pair("all_reduce", library, False)))
            row = {"op": "all_reduce+logger", "mode": "sync", "raw_us": float("nan")}
            rows.append(row | {f"{k}_us": v for k, v in per_call_us(timed, iters, rounds).items()})
        finally:
            comms_logger.disable()
            comms_logger.reset()
    finally:
        dist.destroy_process_group()
    return rows


def _library_pair(op: str, library: object, async_op: bool) -> tuple[object, object]:
    """(the backend's op, the facade's) on 8-float buffers of a world of one, each waited."""
    small, large, out = torch.ones(8), torch.ones(8), torch.empty(8)
    lib = library  # the Backend object of the world

    def waited(start: object) -> object:
        def call() -> None:
            work = start()  # type: ignore[operator]
            if work is not None:
                work.wait()

        return call

    mode = {"async_op": async_op}
    pairs = {
        "all_reduce": (
            lambda: lib.all_reduce(small, ReduceOp.SUM, **mode),
            lambda: dist.all_reduce(small, **mode),
        ),
        "broadcast": (lambda: lib.broadcast(small, 0, **mode), lambda: dist.broadcast(small, 0, **mode)),
        "all_gather": (
            lambda: lib.all_gather_into_tensor(large, small, **mode),
            lambda: dist.all_gather_into_tensor(large, small, **mode),
        ),
        "reduce_scatter": (
            lambda: lib.reduce_scatter_tensor(small, large, ReduceOp.SUM, **mode),
            lambda: dist.reduce_scatter_tensor(small, large, **mode),
        ),
        "all_to_all_single": (
            lambda: lib.all_to_all_single(out, small, None, None, **mode),
            lambda: dist.all_to_all_single(out, small, **mode),
        ),
    }
    bare, ours = pairs[op]
    return waited(bare), waited(ours)


def _with_logger(iters: int, rounds: int) -> dict:
    """all_reduce with the comms logger enabled: its "added" is the logger's cost plus the facade's."""
    from commlayer import comms_logger

    calls = trio("all_reduce", 32, 2, 0, torch.device("cpu"), False)
    comms_logger.enable()
    try:
        timed = {"bare": calls.bare, "raw": calls.raw, "commlayer": calls.commlayer}
        measured = per_call_us(timed, iters, rounds)
    finally:
        comms_logger.disable()
        comms_logger.reset()
    return {"op": "all_reduce+logger", "mode": "sync"} | {f"{k}_us": v for k, v in measured.items()}


def standin_main(options: argparse.Namespace) -> None:
    iters, rounds = options.iters * 50, options.rounds
    library = options.backend if options.backend in ("mpi", "ccl") else None
    if options.before is None:
        rows = measure(iters, rounds) if library is None else measure_library(library, iters, rounds)
        _print_rows(rows)
        if options.json:
            Path(options.json).write_text(json.dumps(rows, indent=1))
        return
    with tempfile.TemporaryDirectory(prefix="commlayer-before-") as site:
        _lay_out(options.before, Path(site))
        runs: dict[str, list[list[dict]]] = {"before": [], "after": []}
        for index in range(options.repeats):
            for side in ("before", "after") if index % 2 == 0 else ("after", "before"):
                runs[side].append(_child(side, site, iters, rounds, options.backend))
    _print_comparison(options.before, runs)


def _child(side: str, site: str, iters: int, rounds: int, backend: str) -> list[dict]:
    env = dict(os.environ)
    if side == "before":
        env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        command = [sys.executable, __file__.replace("standin.py", "torch_vs_commlayer.py"), "--standin"]
        command += ["--iters", str(iters // 50), "--rounds", str(rounds), "--json", output.name]
        command += ["--backend", backend]
        subprocess.run(command, env=env, check=True, cwd=tempfile.gettempdir())
        return json.loads(Path(output.name).read_text())


def _lay_out(ref: str, site: Path) -> None:
    """git commit ``ref``'s commlayer as an importable package in ``site`` (what gpu_site.sh does)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "commlayer", "backends", "pyproject.toml"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(site)], input=archive, check=True)
    (site / "backends").rename(site / "commlayer" / "backends")
    # Built extensions are not in git: the oneCCL binding's build serves REF too where its
    # sources are the same (when they are unchanged).
    if _same_sources(ref, "csrc/ccl"):
        for built in (REPO / "backends" / "ccl").glob("_C*.so"):
            shutil.copy2(built, site / "commlayer" / "backends" / "ccl" / built.name)
    _build_fast_paths(ref, site)
    project = tomllib.loads((site / "pyproject.toml").read_text())["project"]
    info = site / "commlayer-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: commlayer\nVersion: {project['version']}\n")
    lines = []
    for group, points in project["entry-points"].items():
        lines += [f"[{group}]", *(f"{name} = {target}" for name, target in points.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))


def _build_fast_paths(ref: str, site: Path) -> None:
    """Compile ``ref``'s C fast paths, and its tensor reader where it has one, into ``site`` with
    benchmarks/gpu/build.sh, as the GPU scripts do (it knows each layout's folders). Without its
    own builds, REF's commlayer would import the working tree's through the editable install's
    finder: its Python with this tree's C, not REF."""
    folders = ("csrc/torch_launcher/", "csrc/torch_fast_paths/", "csrc/facade_fast_paths/")
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "--name-only", ref, *folders],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not listed:
        return
    with tempfile.TemporaryDirectory(prefix="commlayer-before-csrc-") as tree:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", ref, "csrc"], check=True, capture_output=True
        )
        subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
        build = 'source "$0" && build_c_fast_paths "$1" "$2"'
        script = str(REPO / "benchmarks" / "gpu" / "build.sh")
        environment = {**os.environ, "PYTHON": sys.executable}
        subprocess.run(["bash", "-c", build, script, tree, str(site)], env=environment, check=True)


def _same_sources(ref: str, path: str) -> bool:
    """Whether ``path`` is the same at git commit ``ref`` as in the working tree."""
    command = ["git", "-C", str(REPO), "diff", "--quiet", ref, "--", path]
    return subprocess.run(command, check=False).returncode == 0


def _print_rows(rows: list[dict]) -> None:
    print(f"# stand-in ProcessGroup, torch {torch.__version__}, commlayer from {commlayer.__file__}")
    print(
        f"{'op':<18}{'mode':<6}{'bare_us':>9}{'raw_us':>9}{'cl_us':>9}{'torch wrapper':>15}{'facade':>9}{'added':>8}"
    )
    for row in rows:
        bare, raw, ours = row["bare_us"], row["raw_us"], row["commlayer_us"]
        print(
            f"{row['op']:<18}{row['mode']:<6}{bare:>9.2f}{raw:>9.2f}{ours:>9.2f}"
            f"{raw - bare:>15.2f}{ours - bare:>9.2f}{ours - raw:>+8.2f}"
        )


def _print_comparison(ref: str, runs: dict[str, list[list[dict]]]) -> None:
    """Per op: medians over the repeats of each side's facade cost (commlayer - bare) and added."""
    print(
        f"# stand-in ProcessGroup, torch {torch.__version__}; before = {ref}, after = this tree; us per call"
    )
    print(
        f"{'op':<18}{'mode':<6}{'torch wrapper':>14}{'facade before':>15}{'facade after':>14}{'added before':>14}{'added after':>13}"
    )
    for index, row in enumerate(runs["after"][0]):
        figures = {}
        for side, repeats in runs.items():
            facade = [run[index]["commlayer_us"] - run[index]["bare_us"] for run in repeats]
            added = [run[index]["commlayer_us"] - run[index]["raw_us"] for run in repeats]
            figures[side] = (statistics.median(facade), statistics.median(added))
        wrapper = statistics.median(run[index]["raw_us"] - run[index]["bare_us"] for run in runs["after"])
        print(
            f"{row['op']:<18}{row['mode']:<6}{wrapper:>14.2f}{figures['before'][0]:>15.2f}"
            f"{figures['after'][0]:>14.2f}{figures['before'][1]:>+14.2f}{figures['after'][1]:>+13.2f}"
        )
