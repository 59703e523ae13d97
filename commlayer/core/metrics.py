"""Bandwidth arithmetic and message-size sweeps: neutral ground for ``commlayer bench`` and the comms logger.

Conventions follow nccl-tests' doc/PERFORMANCE.md. ``S`` is the message size in bytes: the whole
buffer for all_reduce and broadcast, the *full* (gathered / pre-scatter) buffer for all_gather and
reduce_scatter, and everything one rank sends for all_to_all. With ``t`` the time of one op::

    algbw = S / t
    busbw = algbw * factor(op, n)

    all_reduce                  2 (n - 1) / n
    all_gather, reduce_scatter  (n - 1) / n
    all_to_all                  (n - 1) / n
    broadcast, reduce           1
    send / recv (ping-pong)     1

busbw is the per-link traffic of an optimal algorithm, so it can be compared to hardware peak
bandwidth whatever ``n`` is. DeepSpeed's comms benchmark reports all_reduce as ``2 S / t`` (no
``(n - 1) / n``); we follow nccl-tests, so our all_reduce busbw is ``(n - 1) / n`` of DeepSpeed's.
"""

from __future__ import annotations

import re

__all__ = [
    "BUSBW_FACTORS",
    "OP_FAMILY",
    "algbw_gbps",
    "busbw_factor",
    "busbw_gbps",
    "format_duration",
    "format_size",
    "parse_size",
    "size_sweep",
]

_RING = lambda n: (n - 1) / n
_TWICE_RING = lambda n: 2 * (n - 1) / n
_ONE = lambda n: 1.0

#: Bus-bandwidth factor per op family, as in nccl-tests' doc/PERFORMANCE.md.
BUSBW_FACTORS = {
    "all_reduce": _TWICE_RING,
    "all_gather": _RING,
    "reduce_scatter": _RING,
    "all_to_all": _RING,
    "broadcast": _ONE,
    "reduce": _ONE,
    "pingpong": _ONE,
}

#: Facade op names (what the comms logger sees) -> the family whose factor they use.
OP_FAMILY = {
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "send": "pingpong",
    "recv": "pingpong",
}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def busbw_factor(op: str, world_size: int) -> float:
    """The nccl-tests factor for ``op`` (a bench op or a facade op name); 1 for unlisted ops."""
    if world_size < 1:
        raise ValueError(f"busbw_factor: world_size expected >= 1, received {world_size}")
    family = OP_FAMILY.get(op, op)
    return BUSBW_FACTORS.get(family, _ONE)(world_size)


def algbw_gbps(nbytes: int, seconds: float) -> float:
    """S / t in GB/s (10^9 bytes per second); 0 for an empty message or a zero time."""
    if nbytes <= 0 or seconds <= 0:
        return 0.0
    return nbytes / seconds / 1e9


def busbw_gbps(op: str, nbytes: int, seconds: float, world_size: int) -> float:
    return algbw_gbps(nbytes, seconds) * busbw_factor(op, world_size)


def parse_size(text: str | int) -> int:
    """``"8"`` -> 8, ``"64K"`` -> 65536, ``"1G"`` -> 2**30 (binary units, as nccl-tests)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(f"expected a size such as 8, 64K, 16M or 1G, received {text!r}")
    number, unit = float(match.group(1)), match.group(2).upper()
    value = number * _UNITS[unit]
    if value != int(value):
        raise ValueError(f"expected a whole number of bytes, received {text!r} (= {value} bytes)")
    return int(value)


def format_size(nbytes: int) -> str:
    """2**20 -> ``"1M"``, 1536 -> ``"1.5K"``; exact powers print without decimals."""
    for unit in ("G", "M", "K"):
        scale = _UNITS[unit]
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{nbytes}"


def format_duration(seconds: float) -> str:
    """A duration as people write it: 3 -> ``"3 s"``, 0.25 -> ``"250 ms"``, 90 -> ``"1 min 30 s"``,
    7260 -> ``"2 h 1 min"``; whole units drop their zero parts."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "min"), (secs, "s")] if hours else [(minutes, "min"), (secs, "s")]
    if hours:
        parts = parts[:2]
    return " ".join(f"{value} {unit}" for value, unit in parts if value) or "0 s"


def size_sweep(min_bytes: int, max_bytes: int, step_factor: float) -> list[int]:
    """Sizes from ``min_bytes`` multiplying by ``step_factor`` while <= ``max_bytes``.

    >>> size_sweep(8, 64, 2)
    [8, 16, 32, 64]
    """
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(
            f"size sweep: expected 1 <= min-bytes <= max-bytes, received {min_bytes} and {max_bytes}"
        )
    if step_factor <= 1 and min_bytes != max_bytes:
        raise ValueError(f"size sweep: expected step-factor > 1, received {step_factor}")
    sizes = [min_bytes]
    while sizes[-1] < max_bytes and step_factor > 1:
        following = int(sizes[-1] * step_factor)
        if following <= sizes[-1]:
            following = sizes[-1] + 1
        if following > max_bytes:
            break
        sizes.append(following)
    return sizes
