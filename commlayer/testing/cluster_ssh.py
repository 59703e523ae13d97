"""Real sshd on every host of a :class:`~.cluster.NetworkCluster`, with keys made for the test.

One ``sshd -D`` per host namespace, each on its own config in the cluster's private folder (host
key, the client key it accepts, pid file); the yielded :class:`SshAccess` is the client side
(``ssh -F <config>``: that key, no known-hosts prompts). The daemons are stopped on exit and the
cluster's teardown kills anything left in its namespaces. Needs Debian's ``openssh-server``::

    with network_cluster() as cluster, cluster_sshd(cluster) as access:
        subprocess.run(cluster.hosts[0].command([*access.ssh, cluster.hosts[1].address, "hostname"]))
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from commlayer.testing.cluster import ClusterHost, NetworkCluster

__all__ = ["SshAccess", "cluster_sshd", "sshd_unavailable_reason"]

_START_SECONDS = 20.0
_SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
_PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd refuses to start without it


@dataclass(frozen=True)
class SshAccess:
    config: Path  # ssh client config: key, user, no host-key prompts

    @property
    def ssh(self) -> tuple[str, ...]:
        return ("ssh", "-F", str(self.config))


def sshd_unavailable_reason() -> str | None:
    if _sshd_path() is None:
        return "sshd is not installed (Debian: apt-get install openssh-server)"
    for tool in ("ssh", "ssh-keygen", "ss"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@contextlib.contextmanager
def cluster_sshd(cluster: NetworkCluster) -> Iterator[SshAccess]:
    """Start an sshd on every host of ``cluster``; stop them all on exit."""
    folder = cluster.workdir / "ssh"
    folder.mkdir(mode=0o700)
    _keygen(folder / "host_key")
    _keygen(folder / "client_key")
    shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
    _PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for host in cluster.hosts:
            daemons.append(_start_sshd(host, folder))
        for host, daemon in zip(cluster.hosts, daemons):
            _wait_listening(host, daemon)
        yield SshAccess(_client_config(folder))
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=5)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=5)


def _sshd_path() -> str | None:
    return next((path for path in _SSHD_CANDIDATES if Path(path).is_file()), shutil.which("sshd"))


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "commlayer-test", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def _start_sshd(host: ClusterHost, folder: Path) -> subprocess.Popen[bytes]:
    config = folder / f"sshd_config-h{host.index}"
    config.write_text(
        "\n".join(
            [
                "Port 22",
                f"ListenAddress {host.address}",
                f"HostKey {folder / 'host_key'}",
                f"AuthorizedKeysFile {folder / 'authorized_keys'}",
                f"PidFile {folder / f'sshd-h{host.index}.pid'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",  # the key files live in the test's own folder
                "PrintMotd no",
                "MaxStartups 64",
                "MaxSessions 64",
                "LogLevel ERROR",
                "",
            ]
        ),
        encoding="ascii",
    )
    sshd = _sshd_path() or "sshd"
    return subprocess.Popen(host.command([sshd, "-D", "-e", "-f", str(config)]), stdin=subprocess.DEVNULL)


def _wait_listening(host: ClusterHost, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(
                f"sshd on {host.name} exited with code {daemon.returncode} (its stderr is above)"
            )
        listening = subprocess.run(
            ["ss", "-N", host.namespace, "-Hltn", "sport = :22"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if host.address in listening.stdout:
            return
        time.sleep(0.05)
    raise RuntimeError(f"sshd on {host.name} did not listen on {host.address}:22 within {_START_SECONDS:g}s")


def _client_config(folder: Path) -> Path:
    config = folder / "ssh_config"
    config.write_text(
        "\n".join(
            [
                "Host *",
                "  User root",
                f"  IdentityFile {folder / 'client_key'}",
                "  IdentitiesOnly yes",
                "  StrictHostKeyChecking no",
                "  UserKnownHostsFile /dev/null",
                "  BatchMode yes",
                "  ConnectTimeout 10",
                "  LogLevel ERROR",
                "",
            ]
        ),
        encoding="ascii",
    )
    return config
