"""The records of benchmarks/overhead/mpi_vs_mpi4py.py and their reports: the JSON file and the markdown tables."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


@dataclass(frozen=True)
class Record:
    op: str
    nbytes: int  # per rank: the reduced, contributed or broadcast buffer
    variant: str
    seconds: float  # per op, slowest rank, best round (other load on the host only adds time)
    median_seconds: float  # the same, median over rounds
    world_size: int
    library: str
    raw_ratio: float = float("nan")  # median over rounds of raw's time / this variant's, same round
    fast_ratio: float = float("nan")  # raw's fastest-half mean / this variant's, over the same rounds


def write_results(path: Path, records: list[Record], command: str) -> None:
    """One JSON file, a record per line, times to 4 significant digits."""
    rows = []
    for record in records:
        row = asdict(record)
        row.update(
            seconds=float(f"{record.seconds:.4g}"), median_seconds=float(f"{record.median_seconds:.4g}")
        )
        row["library"] = record.library.split(",")[0].replace(" for Linux* OS", "")
        rows.append(json.dumps(row, separators=(",", ":")))
    header = f'{{\n "machine": {json.dumps(machine())},\n "command": {json.dumps(command)},\n "records": [\n'
    path.write_text(header + ",\n".join(f"  {row}" for row in rows) + "\n ]\n}\n")


def read_results(path: Path) -> list[list[Record]]:
    """Every run in a results file: one run as written by ``--out``, or several under ``runs``."""
    document = json.loads(path.read_text())
    runs = document.get("runs", [document])
    return [[Record(**row) for row in run["records"]] for run in runs]


def render(records: list[Record]) -> str:
    """Markdown: one table per (library, world size); times in us, ratios against raw and gloo."""
    lines = []
    groups = sorted({(record.library, record.world_size) for record in records})
    for library, world_size in groups:
        chosen = [r for r in records if (r.library, r.world_size) == (library, world_size)]
        table = {(r.op, r.nbytes, r.variant): r for r in chosen}
        title = f"**{library.split(',')[0]}, {world_size} ranks**"
        caption = (
            f"\n{title} (us per op, slowest rank, best of the rounds; raw/x: raw's fastest-half mean over "
            "x's, the median paired per-round ratio in brackets; raw/control: the method's noise floor)\n"
        )
        lines.append(caption)
        header = (
            "| op | bytes | raw | mpi | mpi-unchecked | mpi-requests | gloo | raw/mpi | mpi - raw (us) "
            "| raw/mpi-unchecked | raw/mpi-requests | mpi-requests - raw (us) | gloo/mpi | raw/control |"
        )
        lines += [header, "|" + "---|" * (header.count("|") - 1)]
        for op in OPS:
            for nbytes in sorted({r.nbytes for r in chosen if r.op == op}):
                lines.append(_row(op, nbytes, table))
    return "\n".join(lines)


def _row(op: str, nbytes: int, table: dict[tuple[str, int, str], Record]) -> str:
    """raw/mpi is mpi's share of raw bandwidth; gloo/mpi > 1 means mpi is that many times faster."""
    variants = ("raw", "mpi", "mpi-unchecked", "mpi-requests", "gloo", "control")
    found = {variant: table.get((op, nbytes, variant)) for variant in variants}
    us = {variant: record.seconds * 1e6 if record else float("nan") for variant, record in found.items()}

    def against_raw(variant: str) -> str:
        record = found[variant]
        fast, paired = (record.fast_ratio, record.raw_ratio) if record else (float("nan"), float("nan"))
        return f"{fast:.3f} ({paired:.3f})"

    cells = [op, _size(nbytes)] + [f"{us[variant]:.1f}" for variant in variants[:-1]]
    cells += [against_raw("mpi"), f"{us['mpi'] - us['raw']:+.1f}"]
    cells += [
        against_raw("mpi-unchecked"),
        against_raw("mpi-requests"),
        f"{us['mpi-requests'] - us['raw']:+.1f}",
        f"{us['gloo'] / us['mpi']:.2f}",
        against_raw("control"),
    ]
    return "| " + " | ".join(cells) + " |"


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"
