"""The conformance certificate: one verdict per (op, reduce op, dtype, group, sync/async) cell.

Each rank records its own verdicts; :meth:`Certificate.merge` folds the ranks' certificates into
one, where a cell fails if it failed on any rank. :meth:`Certificate.render` prints the table a
backend author reads: one row per op (and reduce op), one column per dtype.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["FAIL", "MODES", "PASS", "UNSUPPORTED", "Cell", "Certificate", "Verdict"]

PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"
# A failure outranks a declared gap, which outranks a pass, when several verdicts share a cell.
_SEVERITY = {PASS: 0, UNSUPPORTED: 1, FAIL: 2}
MODES = (("world", "sync"), ("world", "async"), ("subgroup", "sync"), ("subgroup", "async"))
_SHOWN = {PASS: "pass", UNSUPPORTED: "n/s", FAIL: "FAIL"}
_DETAIL_CHARS = 160


@dataclass(frozen=True, order=True)
class Cell:
    """One combination the suite exercises; ``dtype``/``reduce_op`` are "" where the op has none."""

    op: str
    reduce_op: str = ""
    dtype: str = ""
    group: str = "world"  # "world" | "subgroup"
    mode: str = "sync"  # "sync" | "async"

    @property
    def label(self) -> str:
        parts = (self.op, self.reduce_op, self.dtype, self.group, self.mode)
        return " ".join(part for part in parts if part)


@dataclass(frozen=True)
class Verdict:
    """What happened to one cell on one rank; ``detail`` says why it failed."""

    cell: Cell
    status: str
    rank: int
    detail: str = ""


@dataclass
class Certificate:
    """The verdicts of one run, in the order they were recorded (a per-run recorder, never shared)."""

    backend: str
    world_size: int
    verdicts: list[Verdict] = field(default_factory=list)

    def record(self, cell: Cell, status: str, rank: int, detail: str = "") -> None:
        self.verdicts.append(Verdict(cell, status, rank, detail[:_DETAIL_CHARS]))

    def failures(self) -> list[Verdict]:
        return [verdict for verdict in self.verdicts if verdict.status == FAIL]

    def counts(self) -> dict[str, int]:
        merged = self.merged()
        return {status: sum(1 for v in merged.values() if v.status == status) for status in _SEVERITY}

    def merged(self) -> dict[Cell, Verdict]:
        """The worst verdict of each cell over every rank."""
        worst: dict[Cell, Verdict] = {}
        for verdict in self.verdicts:
            known = worst.get(verdict.cell)
            if known is None or _SEVERITY[verdict.status] > _SEVERITY[known.status]:
                worst[verdict.cell] = verdict
        return worst

    @property
    def passed(self) -> bool:
        return bool(self.verdicts) and not self.failures()

    @classmethod
    def merge(cls, certificates: Sequence[Certificate]) -> Certificate:
        """One certificate holding every rank's verdicts."""
        first = certificates[0]
        verdicts = [verdict for certificate in certificates for verdict in certificate.verdicts]
        return cls(first.backend, first.world_size, verdicts)

    # --- persistence (ranks hand their verdicts to the launching process through files) ----------

    def write(self, path: Path) -> None:
        """Write atomically: the reader may look while a hung world is being stopped."""
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        body = {"backend": self.backend, "world_size": self.world_size}
        body["verdicts"] = [
            {**asdict(v.cell), "status": v.status, "rank": v.rank, "detail": v.detail} for v in self.verdicts
        ]
        partial.write_text(json.dumps(body), encoding="utf-8")
        os.replace(partial, path)

    @classmethod
    def read(cls, path: Path) -> Certificate:
        body = json.loads(path.read_text(encoding="utf-8"))
        verdicts = [
            Verdict(
                Cell(row["op"], row["reduce_op"], row["dtype"], row["group"], row["mode"]),
                row["status"],
                row["rank"],
                row["detail"],
            )
            for row in body["verdicts"]
        ]
        return cls(body["backend"], body["world_size"], verdicts)

    # --- the table -------------------------------------------------------------------------------

    def render(self, dtypes: Iterable[str]) -> str:
        """The certificate table, the failures under it, and a one-line verdict."""
        merged = self.merged()
        columns = [*dtypes, ""]
        rows = list(dict.fromkeys((cell.op, cell.reduce_op) for cell in merged))
        used = [column for column in columns if any(cell.dtype == column for cell in merged)]
        header = ["op", *(column or "-" for column in used)]
        body = [
            [f"{op} {reduce}".strip(), *(_summary(merged, op, reduce, d) for d in used)]
            for op, reduce in rows
        ]
        lines = _aligned([header, *body])
        lines.append(
            "each cell: every mode it applies to (world and subgroup, sync and async); n/s = declared unsupported "
            "(and rejected with UnsupportedError); blank = not applicable"
        )
        lines += [f"FAIL {v.cell.label} (rank {v.rank}): {v.detail}" for v in _first_failures(merged)]
        counts = self.counts()
        verdict = "CONFORMS" if self.passed else "DOES NOT CONFORM"
        lines.append(
            f"backend '{self.backend}' on {self.world_size} ranks: {counts[PASS]} cells passed, "
            f"{counts[FAIL]} failed, {counts[UNSUPPORTED]} declared unsupported -> {verdict}"
        )
        return "\n".join(lines)


def _summary(merged: dict[Cell, Verdict], op: str, reduce_op: str, dtype: str) -> str:
    statuses = [
        merged[cell].status
        for cell in (Cell(op, reduce_op, dtype, group, mode) for group, mode in MODES)
        if cell in merged
    ]
    if not statuses:
        return ""
    return _SHOWN[max(statuses, key=_SEVERITY.__getitem__)]


def _first_failures(merged: dict[Cell, Verdict]) -> list[Verdict]:
    return [verdict for verdict in merged.values() if verdict.status == FAIL]


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    return ["  ".join(text.ljust(width) for text, width in zip(row, widths)).rstrip() for row in rows]
