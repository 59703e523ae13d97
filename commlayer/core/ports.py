"""Small network helpers shared by the launcher, the test harness and backends (stdlib only)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 race applies).

    Returns:
        The port number the operating system handed out for an ephemeral bind.

    Example::

        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])
