"""Warm starts for run_world's local ranks: fork them from a server that has imported torch.

Importing torch is most of what a rank costs before its first collective, and a test suite
starts hundreds of ranks. :func:`warm_command` turns a rank's ``python -m MODULE ...`` command
into one that a fork server (``fork_server_main.py``, one per distinct import-time environment, which
has imported torch and the rank worker) runs for it: the rank still gets its own stdio,
environment, working directory, exit status and signals. Any command the server cannot take, or
any trouble starting one, keeps the cold start.
``COMMLAYER_TESTING_FORK_SERVER=0`` turns warm starts off.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from commlayer.core import settings

__all__ = ["warm_command"]

_SCRIPT = str(Path(__file__).with_name("fork_server_main.py"))
_READY_TIMEOUT_S = 60.0
# The modules a server imports for its ranks: torch's import is most of a rank's start-up, the
# worker's (commlayer's) most of the rest; then the facade and the backends nearly every rank
# initialises (none reads the environment or starts a thread on import).
_PRELOAD = (
    "commlayer.testing.worker",
    "commlayer.dist",
    "commlayer.backends.gloo",
    "commlayer.backends.shm",
)
# Variables that may be read while those modules are imported (or by the dynamic loader): a server
# serves only ranks whose values match its own. Each forked rank applies PYTHONPATH and
# PYTHONUNBUFFERED itself, and its results and trace folders are read only once it runs.
_IMPORT_TIME_PREFIXES = (
    "COMMLAYER_",
    "TORCH_",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "LD_",
    "CUDA_",
    "CCL_",
    "I_MPI_",
    "OMPI_",
    "PYTHON",
)
_PER_RANK_VARIABLES = frozenset(
    {"PYTHONPATH", "PYTHONUNBUFFERED", settings.TESTING_RESULTS_DIR.name, settings.TRACE_DIR.name}
)


@dataclass(frozen=True)
class _Server:
    process: subprocess.Popen[str]
    folder: str

    @property
    def socket_path(self) -> str:
        return f"{self.folder}/socket"

    def stop(self) -> None:
        self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


_servers: dict[tuple[tuple[str, str], ...], _Server | None] = {}
_lock = threading.Lock()


def warm_command(command: Sequence[str], env: Mapping[str, str]) -> tuple[str, ...]:
    """``command`` run by a warm fork server for ranks with environment ``env``, or unchanged.

    Args:
        command: a rank's command, ``(sys.executable, "-m", MODULE, *ARGS)``.
        env: the ranks' environment, less the per-rank launcher variables.
    """
    command = tuple(command)
    if not settings.TESTING_FORK_SERVER.value(env) or command[:2] != (sys.executable, "-m"):
        return command
    server = _server_for(env)
    if server is None:
        return command
    return (sys.executable, "-S", "-E", _SCRIPT, "run", server.socket_path, *command[1:])


def _server_for(env: Mapping[str, str]) -> _Server | None:
    signature = tuple(
        sorted(
            (name, value)
            for name, value in env.items()
            if name.startswith(_IMPORT_TIME_PREFIXES) and name not in _PER_RANK_VARIABLES
        )
    )
    with _lock:
        server = _servers.get(signature)
        if server is not None and server.process.poll() is not None:
            server.stop()  # it died (killed from outside): a fresh one serves the next world
            del _servers[signature]
        if signature not in _servers:
            _servers[signature] = _start_server(env)
        return _servers[signature]


def _start_server(env: Mapping[str, str]) -> _Server | None:
    folder = tempfile.mkdtemp(prefix="commlayer-fork-server-")
    process = subprocess.Popen(
        [
            sys.executable,
            _SCRIPT,
            "serve",
            f"{folder}/socket",
            settings.TESTING_SUPERVISED_PID.name,
            *_PRELOAD,
        ],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    server = _Server(process, folder)
    if _wait_ready(process):
        return server
    server.stop()
    return None


def _wait_ready(process: subprocess.Popen[str]) -> bool:
    assert process.stdout is not None
    ready = threading.Event()

    def read_first_line() -> None:
        if process.stdout.readline().strip() == "ready":
            ready.set()

    threading.Thread(target=read_first_line, daemon=True).start()
    return ready.wait(_READY_TIMEOUT_S)


@atexit.register
def _stop_servers() -> None:
    with _lock:
        for server in _servers.values():
            if server is not None:
                server.stop()
        _servers.clear()
