"""Hostfiles and ``--include`` / ``--exclude`` filters, as DeepSpeed users write them.

A hostfile names one host per line with its slots (the ranks it can take); ``#`` starts a comment::

    node1 slots=4
    node2 slots=4   # a comment

A filter is ``@``-separated hosts, each optionally followed by ``:`` and comma-separated slot
indices: ``--include node1:0,1@node2`` keeps slots 0 and 1 of node1 and every slot of node2;
``--exclude node2:3`` drops slot 3 of node2. Hosts keep the hostfile's order, slots ascend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HostSlots", "HostfileError", "parse_filter", "parse_hostfile", "read_hostfile", "select_hosts"]

_LINE = re.compile(r"(?P<host>[^\s=]+)\s+slots\s*=\s*(?P<slots>\d+)")


class HostfileError(ValueError):
    """A malformed hostfile or filter, or a filter that selects nothing."""


@dataclass(frozen=True)
class HostSlots:
    host: str
    slots: tuple[int, ...]  # the slot indices ranks may use on this host


def read_hostfile(path: Path) -> list[HostSlots]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as problem:
        raise HostfileError(
            f"commlayer run: argument '--hostfile' expected a readable file, received {str(path)!r} ({problem.strerror})"
        ) from None
    return parse_hostfile(text, str(path))


def parse_hostfile(text: str, source: str = "<hostfile>") -> list[HostSlots]:
    """``"a slots=2\\nb slots=1"`` -> ``[HostSlots('a', (0, 1)), HostSlots('b', (0,))]``."""
    hosts: dict[str, HostSlots] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.fullmatch(line)
        if match is None or int(match["slots"]) < 1:
            raise HostfileError(
                f"{source}:{number}: expected 'HOST slots=N' with N >= 1, received {raw.strip()!r}"
            )
        if match["host"] in hosts:
            raise HostfileError(f"{source}:{number}: host {match['host']!r} is listed twice")
        hosts[match["host"]] = HostSlots(match["host"], tuple(range(int(match["slots"]))))
    if not hosts:
        raise HostfileError(f"{source}: expected at least one 'HOST slots=N' line, received none")
    return list(hosts.values())


def parse_filter(spec: str, option: str) -> dict[str, tuple[int, ...] | None]:
    """``"a:0,1@b"`` -> ``{"a": (0, 1), "b": None}`` (None: every slot)."""
    chosen: dict[str, tuple[int, ...] | None] = {}
    for part in spec.split("@"):
        host, colon, slots = part.partition(":")
        if not host or (colon and not re.fullmatch(r"\d+(,\d+)*", slots)):
            raise HostfileError(
                f"commlayer run: argument '{option}' expected 'host[:slot,slot]@host...', received {spec!r}"
            )
        chosen[host] = tuple(sorted({int(slot) for slot in slots.split(",")})) if colon else None
    return chosen


def select_hosts(
    hosts: list[HostSlots], include: str | None = None, exclude: str | None = None
) -> list[HostSlots]:
    """The hosts and slots left after ``include`` (if given) and then ``exclude``."""
    if include is not None and exclude is not None:
        raise HostfileError(
            "commlayer run: arguments '--include' and '--exclude' are exclusive, received both"
        )
    known = {entry.host: entry for entry in hosts}
    if include is not None:
        wanted = parse_filter(include, "--include")
        _check_known(wanted, known, "--include")
        hosts = [
            HostSlots(e.host, e.slots if wanted[e.host] is None else wanted[e.host])
            for e in hosts
            if e.host in wanted
        ]
    if exclude is not None:
        unwanted = parse_filter(exclude, "--exclude")
        _check_known(unwanted, known, "--exclude")
        hosts = [
            HostSlots(
                e.host,
                ()
                if unwanted.get(e.host, ()) is None
                else tuple(s for s in e.slots if s not in unwanted.get(e.host, ())),
            )
            for e in hosts
        ]
    hosts = [entry for entry in hosts if entry.slots]
    if not hosts:
        raise HostfileError("commlayer run: the --include/--exclude filters leave no host and slot to run on")
    return hosts


def _check_known(
    chosen: Mapping[str, tuple[int, ...] | None], known: Mapping[str, HostSlots], option: str
) -> None:
    for host, slots in chosen.items():
        if host not in known:
            raise HostfileError(
                f"commlayer run: argument '{option}' names host {host!r}, which the hostfile does not list"
            )
        bad = [slot for slot in slots or () if slot not in known[host].slots]
        if bad:
            raise HostfileError(
                f"commlayer run: argument '{option}' expected slots of {host!r} in 0..{len(known[host].slots) - 1}, received {bad}"
            )
