"""Flight-recorder dumps live in a folder per job; ``commlayer trace analyze`` reads the newest
job of the configured folder and refuses a folder that mixes jobs; ``trace export --torch`` writes
dumps that torch's own analyzer (installed with torch) reads. Every rank of a job dumps into one
folder under mpirun (Intel MPI gives its ranks no id in common; Open MPI) and torchrun.

One real 2-rank world dumps as job "job-b"; an older job "job-a" is a copy of it with its own
job id, which the mixing check then meets in a folder of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commlayer.testing import run_world
from commlayer.testing.mpi import mpirun_unavailable_reason

pytestmark = pytest.mark.multirank

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trace")
    env = {"COMMLAYER_TRACE_DIR": str(root), "COMMLAYER_JOB_ID": "job-b"}
    run_world("tests.observability.trace_folders_ranks:run", 2, env=env, timeout=120)
    older = root / "job-a"
    shutil.copytree(root / "job-b", older)
    for path in older.iterdir():
        dump = json.loads(path.read_text())
        path.write_text(json.dumps({**dump, "job": "job-a"}))
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    return root


def commlayer(*argv: str, trace_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COMMLAYER_TRACE_DIR": str(trace_dir)} if trace_dir else dict(os.environ)
    return subprocess.run(
        [sys.executable, "-m", "commlayer", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_analyze_defaults_to_the_newest_job_of_the_configured_folder(trace_root: Path) -> None:
    done = commlayer("trace", "analyze", trace_dir=trace_root)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"dumps of job folder {trace_root / 'job-b'}"
    assert "MISMATCH" not in done.stdout
    assert "group 'world' (ranks 0, 1): every rank that dumped completed collective" in done.stdout


def test_a_folder_mixing_two_jobs_is_refused(trace_root: Path, tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(trace_root / "job-a" / "rank0.json", mixed)
    shutil.copy(trace_root / "job-b" / "rank1.json", mixed)
    done = commlayer("trace", "analyze", str(mixed))
    assert done.returncode == 2 and done.stdout == ""
    assert "holds the dumps of more than one job (job 'job-a': rank 0; job 'job-b': rank 1)" in done.stderr


def test_torch_reads_the_exported_dumps(trace_root: Path, tmp_path: Path) -> None:
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    out = tmp_path / "torch"
    done = commlayer("trace", "export", "--torch", str(trace_root / "job-b"), str(out))
    assert done.returncode == 0, done.stderr
    assert f"wrote {out / 'commlayer_trace_rank_0'}" in done.stdout
    args: argparse.Namespace = JobConfig().parse_args([str(out)])
    details, version = read_dir(args)
    database = build_db(details, args, version)
    names = [collective.collective_name for collective in database.collectives]
    assert names[:4] == [
        "gloo:all_reduce",
        "gloo:broadcast",
        "gloo:_all_gather_base",
        "gloo:_reduce_scatter_base",
    ]
    assert {collective.pass_check for collective in database.collectives} == {True}
    script = Path(sys.executable).with_name("torchfrtrace")
    analyzer = subprocess.run(
        [str(script), str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert analyzer.returncode == 0, analyzer.stdout + analyzer.stderr
    assert "Traceback" not in analyzer.stderr


def _one_job_folder(root: Path, world_size: int) -> Path:
    folders = [folder for folder in root.iterdir() if folder.is_dir()]
    assert len(folders) == 1, f"expected one job folder, found {folders}"
    assert sorted(path.name for path in folders[0].glob("rank*.json")) == [
        f"rank{rank}.json" for rank in range(world_size)
    ]
    done = commlayer("trace", "analyze", trace_dir=root)
    assert done.returncode == 0 and "no dump" not in done.stdout, done.stdout + done.stderr
    return folders[0]


@pytest.mark.mpi
@pytest.mark.parametrize("mpi", ["intel-mpi", "openmpi"])
def test_every_rank_under_mpirun_dumps_into_one_folder(mpi: str, tmp_path: Path) -> None:
    env = {"COMMLAYER_TRACE_DIR": str(tmp_path), "COMMLAYER_JOB_ID": "", "COMMLAYER_MPI": mpi}
    reason = mpirun_unavailable_reason({**os.environ, **env})
    if reason is not None:
        pytest.skip(f"mpirun with {mpi} unavailable: {reason}")
    target = "tests.observability.trace_folders_ranks:dump_without_a_job_id"
    run_world(target, 3, backend="mpi", launcher="mpirun", env=env, timeout=120)
    _one_job_folder(tmp_path, 3)


def test_every_rank_under_torchrun_dumps_into_one_folder(tmp_path: Path) -> None:
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("COMMLAYER_JOB", "MASTER_"))
    }
    env.update(COMMLAYER_TRACE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    done = subprocess.run(
        [*argv, "-m", "tests.observability.trace_folders_ranks"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    _one_job_folder(tmp_path, 2)
