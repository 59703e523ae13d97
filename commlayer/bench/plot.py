"""``--plot FILE.png``: busbw against size (one line per backend and op) and small-message latency.

matplotlib is imported here only, with the Agg backend, so the benchmark runs headless and the
rest of ``commlayer bench`` works without matplotlib installed (``pip install 'commlayer[bench]'``).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from .formulas import format_size
from .records import BenchRecord

__all__ = ["SMALL_MESSAGE_BYTES", "write_plot"]

#: Messages up to this size are latency-bound; the right-hand panel shows their time.
SMALL_MESSAGE_BYTES = 64 << 10


def write_plot(path: str | Path, records: Sequence[BenchRecord], title: str) -> None:
    pyplot = _pyplot()
    figure, (bandwidth_axes, latency_axes) = pyplot.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    series = _series(records)
    for (backend, op), rows in series.items():
        label = f"{backend} {op}"
        if op == "barrier":
            latency_axes.axhline(rows[0].time_us, linestyle=":", color="gray", label=f"{label} ({rows[0].time_us:.1f} us)")
            continue
        sizes = [row.bytes for row in rows]
        bandwidth_axes.plot(sizes, [row.busbw_gbps for row in rows], marker="o", markersize=3, label=label)
        small = [row for row in rows if row.bytes <= SMALL_MESSAGE_BYTES]
        if small:
            latency_axes.plot([row.bytes for row in small], [row.time_us for row in small], marker="o", markersize=3, label=label)
    _style(bandwidth_axes, "busbw (GB/s, nccl-tests factors)", "bus bandwidth")
    _style(latency_axes, "time per op (us, slowest rank)", f"latency up to {format_size(SMALL_MESSAGE_BYTES)}B")
    latency_axes.set_yscale("log")
    figure.suptitle(title)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)


def _series(records: Sequence[BenchRecord]) -> dict[tuple[str, str], list[BenchRecord]]:
    series: dict[tuple[str, str], list[BenchRecord]] = defaultdict(list)
    for record in records:
        series[(record.backend, record.op)].append(record)
    return {key: sorted(rows, key=lambda row: row.bytes) for key, rows in series.items()}


def _style(axes: Any, ylabel: str, title: str) -> None:
    axes.set_xscale("log", base=2)
    axes.set_xlabel("message size S (bytes)")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.xaxis.set_major_formatter(_size_formatter())
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")


def _size_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _position: format_size(int(value)) if value >= 1 else "")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError as missing:
        raise RuntimeError("--plot needs matplotlib: pip install 'commlayer[bench]'") from missing
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot
