"""Text output of ``commlayer bench``: a table per (op, backend), then backends side by side.

Example (2 ranks, gloo and mpi)::

    # all_reduce | gloo | 2 ranks | cpu | float32 | 20 iters, 5 warmup | blocking, checked once
           bytes       count       dtype     time_us  algbw_GB/s  busbw_GB/s   wrong
               8           2     float32       31.20       0.000       0.000       0

    # side by side: busbw GB/s (barrier: time us); ratio > 1 means faster than gloo
    op             bytes      gloo       mpi  mpi/gloo
    all_reduce         8     0.000     0.001     2.10x
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TextIO

from commlayer.bench.options import BenchOptions
from commlayer.bench.records import BenchRecord, SweepResult

__all__ = ["RowPrinter", "format_closing", "format_report", "format_side_by_side", "format_table"]

_COLUMNS = ("bytes", "count", "dtype", "time_us", "algbw_GB/s", "busbw_GB/s", "wrong")
_WIDTHS = (12, 12, 10, 12, 12, 12, 8)


def format_report(result: SweepResult, options: BenchOptions) -> str:
    """Every (op, backend) table in the order run, the side-by-side summary, then skip notes."""
    devices = dict(result.devices)
    blocks = []
    for (op, backend), rows in _grouped(result.records).items():
        header = _header(op, backend, result.world_size, devices.get(backend, "?"), options)
        blocks.append(format_table(rows, header))
    summary = format_side_by_side(result.records)
    if summary:
        blocks.append(summary)
    if result.notes:
        blocks.append("\n".join("note: " + note.replace("\n", "\n      ") for note in result.notes))
    return "\n\n".join(blocks) + "\n"


class RowPrinter:
    """Prints each row the moment it is measured (flushed, in a pipe too); a table's header
    comes before its first row. :func:`format_closing` then adds what needs every row."""

    def __init__(self, options: BenchOptions, world_size: int, stream: TextIO | None = None) -> None:
        self.options = options
        self.world_size = world_size
        self.stream = stream
        self._table: tuple[str, str] | None = None

    def __call__(self, record: BenchRecord, device: str) -> None:
        lines = []
        if self._table != (record.op, record.backend):
            lines += ([""] if self._table is not None else []) + [
                _header(record.op, record.backend, self.world_size, device, self.options),
                _line(_COLUMNS),
            ]
            self._table = (record.op, record.backend)
        lines.append(_row_line(record))
        print("\n".join(lines), file=self.stream or sys.stdout, flush=True)


def format_closing(result: SweepResult) -> str:
    """What follows the streamed tables: the side-by-side summary and the skip notes."""
    blocks = []
    summary = format_side_by_side(result.records)
    if summary:
        blocks.append(summary)
    if result.notes:
        blocks.append("\n".join("note: " + note.replace("\n", "\n      ") for note in result.notes))
    return "".join("\n" + block + "\n" for block in blocks)


def format_table(rows: Sequence[BenchRecord], header: str) -> str:
    return "\n".join([header, _line(_COLUMNS), *(_row_line(row) for row in rows)])


def _row_line(row: BenchRecord) -> str:
    cells = (
        row.bytes,
        row.count,
        row.dtype,
        f"{row.time_us:.2f}",
        _bandwidth(row.algbw_gbps),
        _bandwidth(row.busbw_gbps),
        row.wrong,
    )
    return _line(cells)


def format_side_by_side(records: Sequence[BenchRecord]) -> str:
    """busbw of each backend at each (op, size) and its ratio to the first backend; '' if one."""
    backends = list(dict.fromkeys(record.backend for record in records))
    if len(backends) < 2:
        return ""
    reference, others = backends[0], backends[1:]
    by_key = {(r.op, r.bytes, r.backend): r for r in records}
    columns = ["op", "bytes", *backends, *(f"{name}/{reference}" for name in others)]
    lines = [
        f"# side by side: busbw GB/s (barrier: time us); ratio > 1 means faster than {reference}",
        _summary_line(columns),
    ]
    for op, nbytes in dict.fromkeys((r.op, r.bytes) for r in records):
        row = [by_key.get((op, nbytes, name)) for name in backends]
        values = [_metric(record) for record in row]
        ratios = [_ratio(row[0], record) for record in row[1:]]
        lines.append(_summary_line([op, str(nbytes), *values, *ratios]))
    return "\n".join(lines)


# --- helpers -----------------------------------------------------------------------------


def _grouped(records: Iterable[BenchRecord]) -> dict[tuple[str, str], list[BenchRecord]]:
    grouped: dict[tuple[str, str], list[BenchRecord]] = defaultdict(list)
    for record in records:
        grouped[(record.op, record.backend)].append(record)
    return grouped


def _header(op: str, backend: str, world_size: int, device: str, options: BenchOptions) -> str:
    mode = "async" if options.async_op else "blocking"
    checked = "every iteration checked" if options.check else "checked once"
    ranks = f"{world_size} rank" + ("" if world_size == 1 else "s")
    repeats = f" x {options.repeats} repeats (best)" if options.repeats > 1 else ""
    return (
        f"# {op} | {backend} | {ranks} | {device} | {options.dtype} | "
        f"{options.iters} iters{repeats}, {options.warmup} warmup | {mode}, {checked}"
    )


def _line(cells: Sequence[object]) -> str:
    return "".join(f"{cell!s:>{width}}" for cell, width in zip(cells, _WIDTHS))


def _summary_line(cells: Sequence[str]) -> str:
    first, rest = cells[0], cells[1:]
    return f"{first:<16}" + "".join(f"{cell:>12}" for cell in rest)


def _bandwidth(gbps: float) -> str:
    """3 decimals in the usual range; tiny CPU figures keep their digits instead of reading 0.000."""
    if gbps >= 100:
        return f"{gbps:.1f}"
    if gbps >= 0.001 or gbps == 0:
        return f"{gbps:.3f}"
    return f"{gbps:.2e}"


def _metric(record: BenchRecord | None) -> str:
    if record is None:
        return "-"
    return f"{record.time_us:.2f}" if record.bytes == 0 else _bandwidth(record.busbw_gbps)


def _ratio(reference: BenchRecord | None, other: BenchRecord | None) -> str:
    """other over reference, oriented so that > 1 always means ``other`` is faster."""
    if reference is None or other is None:
        return "-"
    if reference.bytes == 0:
        faster = reference.time_us / other.time_us if other.time_us > 0 else 0.0
    else:
        faster = other.busbw_gbps / reference.busbw_gbps if reference.busbw_gbps > 0 else 0.0
    return f"{faster:.2f}x" if faster else "-"
