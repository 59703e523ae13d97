"""One measured row of ``commlayer bench``, and its JSON / CSV files.

A JSON file is ``{"metadata": {...}, "records": [...]}``: the metadata says where and how the
run was made (:func:`run_metadata`: host, CPU, GPUs, versions of Python, torch, commlayer, MPI and
oneCCL where present, the date and the exact command), each record is an object with exactly
:data:`RECORD_KEYS`; the CSV file has the records' columns in the same order. ``wrong`` counts wrong result elements, summed over ranks: of one
verification run after the timed iterations, or of every timed iteration with ``--check``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["RECORD_KEYS", "BenchRecord", "SweepResult", "read_json", "write_csv", "write_json"]


@dataclass(frozen=True)
class BenchRecord:
    """The slowest rank's time of one (backend, op, size); bandwidths follow from it."""

    backend: str
    op: str
    bytes: int  # nccl-tests' S (see commlayer.core.metrics)
    count: int  # elements in S
    dtype: str
    world_size: int
    time_us: float  # per op: the slowest rank's mean, in the best of the repeats
    algbw_gbps: float
    busbw_gbps: float
    wrong: int  # wrong result elements, summed over ranks and verified iterations

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


RECORD_KEYS = tuple(field.name for field in fields(BenchRecord))


@dataclass(frozen=True)
class SweepResult:
    """What rank 0 reports: the records, why anything was skipped, and how the run was made."""

    records: tuple[BenchRecord, ...]
    notes: tuple[str, ...] = ()
    world_size: int = 1
    devices: tuple[tuple[str, str], ...] = ()  # (backend, device) pairs actually used

    def to_json(self) -> dict[str, Any]:
        return {
            "records": [record.as_dict() for record in self.records],
            "notes": list(self.notes),
            "world_size": self.world_size,
            "devices": [list(pair) for pair in self.devices],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepResult:
        return cls(
            records=tuple(BenchRecord(**row) for row in data["records"]),
            notes=tuple(data.get("notes", ())),
            world_size=int(data.get("world_size", 1)),
            devices=tuple((backend, device) for backend, device in data.get("devices", ())),
        )


def write_json(
    path: str | Path, records: Iterable[BenchRecord], metadata: dict[str, Any] | None = None
) -> None:
    document = {"metadata": metadata or {}, "records": [record.as_dict() for record in records]}
    Path(path).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def read_json(path: str | Path) -> list[BenchRecord]:
    """The records of a JSON file (also of the older bare-list files)."""
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    rows = document["records"] if isinstance(document, dict) else document
    return [BenchRecord(**row) for row in rows]


def write_csv(path: str | Path, records: Sequence[BenchRecord]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as stream:
        writer = csv.DictWriter(stream, fieldnames=RECORD_KEYS)
        writer.writeheader()
        writer.writerows(record.as_dict() for record in records)
