"""Processes by pid, through /proc: whether one still runs (or is gone, for the liveness checks of
the peer monitor and of commlayer.ft), where a pid means something, the descendants of one, and
signalling a set of them (what stopping a supervised process tree needs)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

__all__ = ["gone_reason", "pid_running", "process_age", "process_gone", "process_space"]


def pid_running(pid: int) -> bool:
    """Alive and not a zombie: an exited process nobody has reaped yet counts as gone.

    Popen.poll() cannot tell while another thread waits on the child, and a multi-threaded child
    stays a zombie that waitid() does not report until all its threads are gone; /proc is exact.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass  # no /proc: fall back to a signal-0 probe, which counts zombies as alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_gone(pid: int) -> bool:
    """Whether local process ``pid`` has exited, is a zombie, or is stopped (a stopped process
    makes no progress: a liveness check counts it as gone, where :func:`pid_running` does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X", "T", "t")


def gone_reason(pid: int) -> str:
    """How a liveness check names a peer whose process is gone."""
    return f"its process (pid {pid}) is gone: it exited, was killed or crashed"


def process_space() -> str:
    """Where this process's pid means something: host name, boot and pid namespace. Processes in
    one space can check each other's pids; network-namespace "hosts" on one machine may share a
    host name but not their pids."""
    parts = [socket.gethostname()]
    for read in (
        lambda: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        lambda: os.readlink("/proc/self/ns/pid"),
    ):
        try:
            parts.append(read())
        except OSError:
            parts.append("?")
    return "/".join(part.replace(" ", "_") for part in parts)


def _signal_pids(pids: set[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                parent = _parent_pid(entry.name)
                if parent is not None:
                    children.setdefault(parent, []).append(int(entry.name))
    found, frontier = [], [root]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found.extend(kids)
        frontier.extend(kids)
    return found


def _parent_pid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            # The command name may contain spaces and parentheses; fields resume after the last ')'.
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def process_age(pid: int) -> float | None:
    """Seconds since process ``pid`` started (to a clock tick), or None without /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
