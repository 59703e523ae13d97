"""`commlayer run --hostfile` across two namespace hosts, through real sshd (and pdsh over it).

Every host runs Debian's sshd on a config and keys this test makes (commlayer.testing.cluster_ssh);
the runner itself runs on the first host, as a user logged in there would. The hostfile names
the hosts by address: their names do not resolve. Skip these with ``-m "not multihost"``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from commlayer.testing import require_mpirun
from commlayer.testing.cluster import (
    ClusterOptions,
    NetworkCluster,
    cluster_unavailable_reason,
    network_cluster,
)
from commlayer.testing.cluster_ssh import SshAccess, cluster_sshd, sshd_unavailable_reason

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "tests" / "launch" / "multihost_run_ranks.py")
FT_RANKS = str(REPO / "tests" / "launch" / "ft_launch_ranks.py")
COMMLAYER = str(Path(sys.executable).with_name("commlayer"))
_REASON = cluster_unavailable_reason() or sshd_unavailable_reason()
pytestmark = [
    pytest.mark.multihost,
    pytest.mark.multirank,
    pytest.mark.skipif(_REASON is not None, reason=f"ssh cluster unavailable: {_REASON}"),
]


@pytest.fixture(scope="module")
def ssh_cluster() -> Iterator[tuple[NetworkCluster, SshAccess]]:
    # A shared /dev/shm: Intel MPI takes namespace hosts for one node (see commlayer.testing.cluster).
    with (
        network_cluster(ClusterOptions(hosts=2, private_shm=False)) as cluster,
        cluster_sshd(cluster) as access,
    ):
        yield cluster, access


@pytest.fixture
def job_dir(tmp_path: Path, ssh_cluster: tuple[NetworkCluster, SshAccess]) -> Path:
    cluster, _ = ssh_cluster
    (tmp_path / "hostfile").write_text(
        "".join(f"{host.address} slots=2\n" for host in cluster.hosts), encoding="ascii"
    )
    (tmp_path / ".commlayer_env").write_text("COMMLAYER_TEST_EXPORT=from the env file\n", encoding="ascii")
    return tmp_path


def runner_argv(ssh_cluster: tuple[NetworkCluster, SshAccess], job_dir: Path, *extra: str) -> list[str]:
    cluster, access = ssh_cluster
    run = [COMMLAYER, "run", "--hostfile", str(job_dir / "hostfile"), "--ssh", " ".join(access.ssh), *extra]
    return cluster.hosts[0].command(run, cwd=job_dir)


def runner_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def assert_no_orphans(cluster: NetworkCluster) -> None:
    """Only the sshd daemons may still run in the hosts: no rank, agent or ssh session."""
    deadline = time.monotonic() + 10
    while True:
        left = {
            host: [pid for pid in pids if not _is_sshd_daemon(pid)]
            for host, pids in cluster.leftover_processes().items()
        }
        left = {host: pids for host, pids in left.items() if pids}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert left == {}, {host: [_command_line(pid) for pid in pids] for host, pids in left.items()}


def _is_sshd_daemon(pid: int) -> bool:
    return "sshd -D" in _command_line(pid)


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("launcher", ["ssh", "pdsh", "mpirun"])
def test_hostfile_job_runs_two_ranks_on_each_host(
    launcher: str, ssh_cluster: tuple[NetworkCluster, SshAccess], job_dir: Path
) -> None:
    if launcher == "pdsh" and shutil.which("pdsh") is None:
        pytest.skip("pdsh is not installed")
    if launcher == "mpirun":
        require_mpirun()
    argv = runner_argv(ssh_cluster, job_dir, "--launcher", launcher, SCRIPT, "check", "from the env file")
    done = subprocess.run(
        argv, cwd=job_dir, env=runner_env(), capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    cluster, _ = ssh_cluster
    for rank in range(4):
        host = cluster.hosts[rank // 2]
        # Hydra's -l tags each write ("[3] "), so the line's newline may come tagged on its own.
        tag = f"[{rank}] " if launcher == "mpirun" else f"[{host.address} rank{rank}] "
        assert f"{tag}ok {rank} {host.name}" in done.stdout, done.stdout
    assert_no_orphans(cluster)


def test_rank_killed_on_host_b_stops_host_a_and_is_named(
    ssh_cluster: tuple[NetworkCluster, SshAccess], job_dir: Path
) -> None:
    cluster, _ = ssh_cluster
    mark = job_dir / "killed-at"
    argv = runner_argv(ssh_cluster, job_dir, SCRIPT, "kill", "3", str(mark))
    done = subprocess.run(
        argv, cwd=job_dir, env=runner_env(), capture_output=True, text=True, timeout=180, check=False
    )
    ended = time.time()
    assert done.returncode == 128 + signal.SIGKILL, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last
        == f"commlayer run: rank 3 on {cluster.hosts[1].address} was killed by SIGKILL (exit code 137); stopped every other host"
    )
    assert ended - float(mark.read_text(encoding="ascii")) < 10
    assert_no_orphans(cluster)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signals_reach_the_ranks_on_every_host(
    signum: signal.Signals, ssh_cluster: tuple[NetworkCluster, SshAccess], job_dir: Path
) -> None:
    cluster, _ = ssh_cluster
    argv = runner_argv(ssh_cluster, job_dir, SCRIPT, "signals", str(job_dir))
    runner = subprocess.Popen(
        argv, cwd=job_dir, env=runner_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(120, runner.kill)  # a runner that never gets ready must not hang the suite
    watchdog.start()
    try:
        ready = [runner.stdout.readline() for _ in range(4)]  # type: ignore[union-attr]
        assert all("] ready " in line for line in ready), ready
        runner.send_signal(signum)
        stdout, stderr = runner.communicate(timeout=60)
    finally:
        watchdog.cancel()
        runner.kill()
    assert runner.returncode == 128 + signum, stdout + stderr
    received = sorted(path.name for path in job_dir.glob("rank*.SIG*"))
    assert received == [f"rank{rank}.{signum.name}" for rank in range(4)]
    assert (job_dir / f"rank3.{signum.name}").read_text(encoding="ascii") == cluster.hosts[1].name
    assert_no_orphans(cluster)


def test_commlayer_bench_across_hosts(ssh_cluster: tuple[NetworkCluster, SshAccess], job_dir: Path) -> None:
    """Every rank runs the sweep in place (as under torchrun); rank 0 writes the records."""
    out = job_dir / "bench.json"
    sweep = [
        "--backends",
        "gloo",
        "--ops",
        "all_reduce,pingpong",
        "-b",
        "8",
        "-e",
        "4K",
        "-f",
        "16",
        "--iters",
        "3",
    ]
    argv = runner_argv(ssh_cluster, job_dir, "-m", "commlayer", "bench", *sweep, "--json", str(out))
    done = subprocess.run(
        argv, cwd=job_dir, env=runner_env(), capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    records = json.loads(out.read_text(encoding="utf-8"))["records"]
    assert {(record["op"], record["bytes"]) for record in records} == {
        (op, size) for op in ("all_reduce", "pingpong") for size in (8, 128, 2048)
    }
    assert all(record["world_size"] == 4 and record["wrong"] == 0 for record in records), records
    assert_no_orphans(ssh_cluster[0])


@pytest.mark.slow
def test_ft_job_restarts_a_member_killed_on_host_b_there_and_finishes(
    ssh_cluster: tuple[NetworkCluster, SshAccess], job_dir: Path
) -> None:
    """`--ft` across hosts: the runner on host A hosts the store, host B's agent restarts its member."""
    cluster, _ = ssh_cluster
    example = ["--steps", "60", "--step-time", "0.15", "--checkpoint-dir", str(job_dir / "checkpoints")]
    argv = runner_argv(ssh_cluster, job_dir, "--ft", FT_RANKS, "die-once", "3", "5", *example)
    done = subprocess.run(
        argv, cwd=job_dir, env=runner_env(), capture_output=True, text=True, timeout=240, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    host_b = cluster.hosts[1].address
    assert f"[{host_b} rank3] commlayer run: rank 3 on {host_b} was killed by SIGKILL" in output, output
    for rank in range(4):
        assert f"rank{rank}] member {rank}: trained to step 60" in output, output
    assert "rank 3 restarted once in its slot and rejoined at step" in output, output
    assert_no_orphans(cluster)
