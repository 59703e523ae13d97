"""A server that imports torch once and forks run_world's local ranks from that warm state.

Run by path, never imported by commlayer::

    python fork_server_main.py serve SOCKET VARIABLE [MODULE...]   # one per environment (fork_server.py)
    python -S -E fork_server_main.py run SOCKET -m MODULE ARGS...

The server imports torch and the given modules (the rank worker's), nothing else: every fork
starts from that state, so a server serves only ranks whose import-time environment is its own
(the harness keeps one server per such environment). A ``run`` process is the rank's stand-in for
whoever started it: it hands the server its stdio, environment and working directory, forwards
the signals it gets to the forked rank, exits with the rank's status, and its death (a SIGKILL
included) kills the rank.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from typing import Any, NoReturn

# A stand-in starts once per rank and needs only the modules above; the server and its ranks
# import the rest where they use it (torch has imported them all already, so a rank finds them
# in sys.modules).

_FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_PR_SET_PDEATHSIG = 1
_LENGTH = struct.Struct("!I")


# ---- the server ----------------------------------------------------------------------------------


def serve(path: str, stand_in_variable: str, preload: list[str]) -> None:
    """Import torch and ``preload``, listen on ``path``, fork a rank per request and report each
    one's exit. Each rank finds its stand-in's pid in the environment variable ``stand_in_variable``.
    """
    import gc
    import importlib
    import select

    _die_with_parent()
    # The imports every rank would otherwise pay for.
    import torch
    import torch.distributed  # noqa: F401

    for module in preload:
        importlib.import_module(module)
    # What is imported now lives as long as every rank: out of the collector's reach, a rank's
    # collections neither scan it nor copy the pages it sits on (each object's header is written).
    gc.collect()
    gc.freeze()

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    print("ready", flush=True)
    ranks: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener], [], [], 0.02)
        if readable:
            connection, _ = listener.accept()
            pid = _fork_rank(connection, [listener, *ranks.values()], stand_in_variable)
            ranks[pid] = connection
        _report_exits(ranks)


def _die_with_parent() -> None:
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):
        pass  # not Linux: the harness stops the server itself at exit
    if os.getppid() != parent:
        os._exit(0)


def _fork_rank(
    connection: socket.socket, servers_sockets: list[socket.socket], stand_in_variable: str
) -> int:
    request, fds = _receive_request(connection)
    request["env"][stand_in_variable] = str(request["stand_in"])
    pid = os.fork()
    if pid == 0:
        for held in (connection, *servers_sockets):
            held.close()
        _become_rank(request, fds)
    for fd in fds:
        os.close(fd)
    connection.sendall(f"pid {pid}\n".encode())
    return pid


def _receive_request(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 4)
    (length,) = _LENGTH.unpack_from(data)
    while len(data) < _LENGTH.size + length:
        data += connection.recv(1 << 16)
    return json.loads(data[_LENGTH.size :]), list(fds)


def _report_exits(ranks: dict[int, socket.socket]) -> None:
    while ranks:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = ranks.pop(pid, None)
        if connection is not None:
            try:
                connection.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass  # the stand-in is gone, and with it whoever waited for this rank
            connection.close()


# ---- a forked rank -------------------------------------------------------------------------------


def _become_rank(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """Turn this fork of the server into the process ``python ARGV`` would have been."""
    stdin, stdout, stderr, stand_in = fds
    for target, fd in enumerate((stdin, stdout, stderr)):
        os.dup2(fd, target)
    for fd in (stdin, stdout, stderr):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _reopen_stdio(unbuffered=bool(os.environ.get("PYTHONUNBUFFERED")))
    _die_with_stand_in(stand_in)
    import random

    random.seed()  # a fresh process draws its own seed; forks of one server would share it
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    os._exit(_run_as_main(request["argv"]))


def _reopen_stdio(unbuffered: bool) -> None:
    import io

    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            line_buffering=name == "stderr",
            write_through=unbuffered,
            errors="backslashreplace" if name == "stderr" else "strict",
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _die_with_stand_in(stand_in: int) -> None:
    """Read the stand-in's pipe until it closes, which happens only when the stand-in has died."""

    import threading

    def watch() -> None:
        while os.read(stand_in, 1):
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="stand-in watch", daemon=True).start()


def _run_as_main(argv: list[str]) -> int:
    """Run ``-m MODULE ARGS...`` as ``__main__``, then exit as the interpreter would."""
    import atexit
    import runpy
    import threading

    if len(argv) < 2 or argv[0] != "-m":
        print(f"fork_server: expected '-m MODULE ARGS...', received {argv!r}", file=sys.stderr)
        return 2
    module = argv[1]
    sys.argv = [module, *argv[2:]]
    pythonpath = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[:] = [os.getcwd(), *pythonpath, *_interpreter_path()]
    code = _exit_code(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    threading._shutdown()  # type: ignore[attr-defined] - what interpreter exit does first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _interpreter_path() -> list[str]:
    # The server's own sys.path minus its script folder and PYTHONPATH: stdlib and site-packages.
    skipped = {os.path.dirname(os.path.abspath(__file__))}
    skipped.update(entry for entry in _SERVER_PYTHONPATH if entry)
    return [entry for entry in _SERVER_PATH if entry not in skipped]


def _exit_code(main: Any) -> int:
    try:
        main()
    except SystemExit as exit_request:
        code = exit_request.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - an uncaught exception ends a process with code 1
        import traceback

        traceback.print_exc()
        return 1
    return 0


# ---- the stand-in --------------------------------------------------------------------------------


def run(path: str, argv: list[str]) -> NoReturn:
    """Ask the server at ``path`` to fork ``argv`` with this process's stdio, environment and cwd."""
    # The write end stays open, unused, until this process dies: the rank watches for that.
    stand_in_read, _open_until_death = os.pipe()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.connect(path)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "stand_in": os.getpid()}
    payload = json.dumps(request).encode()
    socket.send_fds(server, [_LENGTH.pack(len(payload)) + payload], [0, 1, 2, stand_in_read])
    os.close(stand_in_read)
    replies = server.makefile("r")
    pid = int(replies.readline().split()[1])
    for signum in _FORWARDED_SIGNALS:
        signal.signal(signum, lambda received, _frame: _forward(pid, received))
    reply = replies.readline().split()
    if not reply:
        print("fork_server: the server ended before the rank did", file=sys.stderr)
        os._exit(1)
    _exit_like(int(reply[1]))


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _exit_like(code: int) -> NoReturn:
    """Exit as the rank did, a death by signal included, so the supervisor sees the same status."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


_SERVER_PATH = list(sys.path)
_SERVER_PYTHONPATH = os.environ.get("PYTHONPATH", "").split(os.pathsep)

if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1:2] == ["run"]:
        run(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(
            "usage: fork_server_main.py serve SOCKET VARIABLE [MODULE...] | run SOCKET -m MODULE ARGS..."
        )
