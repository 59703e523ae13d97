"""``--plot FILE.png``: per op, busbw against size and latency at small sizes, a line per backend.

One row per op (left: busbw over every size; right: time per op up to
:data:`SMALL_MESSAGE_BYTES`), each backend in the same colour everywhere, so backends are compared
inside a panel; barrier, which has no size, gets a bar per backend in the last row.

matplotlib is imported here only, with the Agg backend, so the benchmark runs headless and the
rest of ``commlayer bench`` works without matplotlib installed (``pip install 'commlayer[bench]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from commlayer.bench.records import BenchRecord
from commlayer.core.metrics import format_size

__all__ = ["SMALL_MESSAGE_BYTES", "write_plot"]

#: Messages up to this size are latency-bound; the right-hand panels show their time.
SMALL_MESSAGE_BYTES = 64 << 10
_ROW_HEIGHT_IN = 2.6


def write_plot(path: str | Path, records: Sequence[BenchRecord], title: str) -> None:
    pyplot = _pyplot()
    backends = list(dict.fromkeys(record.backend for record in records))
    colours = {backend: f"C{index % 10}" for index, backend in enumerate(backends)}
    sized_ops = list(dict.fromkeys(record.op for record in records if record.op != "barrier"))
    barrier = [record for record in records if record.op == "barrier"]
    rows = len(sized_ops) + (1 if barrier else 0)
    figure, axes = pyplot.subplots(
        max(rows, 1),
        2,
        figsize=(11, 1 + _ROW_HEIGHT_IN * max(rows, 1)),
        squeeze=False,
        constrained_layout=True,
    )
    for row, op in enumerate(sized_ops):
        _plot_op(axes[row], [record for record in records if record.op == op], op, colours)
    if barrier:
        _plot_barrier(axes[rows - 1], barrier, colours)
    figure.suptitle(title)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _plot_op(row: Any, records: list[BenchRecord], op: str, colours: dict[str, str]) -> None:
    bandwidth_axes, latency_axes = row
    for backend, colour in colours.items():
        mine = sorted(
            (record for record in records if record.backend == backend), key=lambda record: record.bytes
        )
        if not mine:
            continue
        small = [record for record in mine if record.bytes <= SMALL_MESSAGE_BYTES]
        _line(bandwidth_axes, [r.bytes for r in mine], [r.busbw_gbps for r in mine], colour, backend)
        _line(latency_axes, [r.bytes for r in small], [r.time_us for r in small], colour, backend)
    _style_sizes(bandwidth_axes, f"{op}: busbw (GB/s)")
    _style_sizes(latency_axes, f"{op}: time per op (us), up to {format_size(SMALL_MESSAGE_BYTES)}B")
    latency_axes.set_yscale("log")


def _line(axes: Any, sizes: list[int], values: list[float], colour: str, backend: str) -> None:
    axes.plot(sizes, values, marker="o", markersize=3, color=colour, label=backend)


def _plot_barrier(row: Any, records: list[BenchRecord], colours: dict[str, str]) -> None:
    bars, unused = row
    drawn = bars.bar(
        [r.backend for r in records],
        [r.time_us for r in records],
        color=[colours[r.backend] for r in records],
    )
    bars.bar_label(drawn, fmt="%.1f", fontsize="small")
    bars.set_title("barrier: time per op (us)", fontsize="medium")
    bars.set_axisbelow(True)
    bars.grid(True, axis="y", which="major", alpha=0.3)
    unused.axis("off")


def _style_sizes(axes: Any, title: str) -> None:
    from matplotlib.ticker import FuncFormatter

    axes.set_xscale("log", base=2)
    axes.set_title(title, fontsize="medium")
    axes.grid(True, which="both", alpha=0.3)
    axes.xaxis.set_major_formatter(
        FuncFormatter(lambda value, _position: format_size(int(value)) if value >= 1 else "")
    )
    axes.set_xlabel("message size S (bytes)", fontsize="small")
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ModuleNotFoundError as missing:
        raise RuntimeError("--plot needs matplotlib: pip install 'commlayer[bench]'") from missing
    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot
