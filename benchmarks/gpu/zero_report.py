"""Table of a zero_gpu.sh run: tokens/s and peak GiB per mode, and commlayer's ratios.

``python benchmarks/gpu/zero_report.py results.jsonl`` reads the JSON lines that zero_anchor.py and
zero_gpu.py print (one per mode), or a JSON list of them (``benchmarks/data/zero_training/``), and
prints a Markdown table plus the goals: each
commlayer stage >= 1.3x DeepSpeed's same stage, stage 3 >= FSDP2, peak memory <= DeepSpeed's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = [
    "ddp",
    "fsdp2",
    "ds1",
    "ds2",
    "ds3",
    "cl0",
    "cl1",
    "cl2",
    "cl3",
    "cl1_fused",
    "cl2_fused",
    "cl3_fused",
]


def read(path: Path) -> dict[str, dict]:
    """One row per mode from JSON lines (a run's output) or a JSON list (benchmarks/data)."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        listed = json.loads(text)
    else:
        listed = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return {row["mode"]: row for row in listed}


def table(rows: dict[str, dict]) -> list[str]:
    lines = ["| mode | tokens/s | step ms | peak GiB | loss |", "|---|---|---|---|---|"]
    for mode in sorted(rows, key=lambda m: ORDER.index(m) if m in ORDER else len(ORDER)):
        row = rows[mode]
        lines.append(
            f"| {mode} | {row['tokens_per_s']:,} | {row['step_ms']} | {row['peak_GiB']} | {row['loss']} |"
        )
    return lines


def goals(rows: dict[str, dict]) -> list[str]:
    lines = []
    for stage in (1, 2, 3):
        ours, theirs = rows.get(f"cl{stage}"), rows.get(f"ds{stage}")
        if ours and theirs:
            speed = ours["tokens_per_s"] / theirs["tokens_per_s"]
            memory = ours["peak_GiB"] <= theirs["peak_GiB"]
            lines.append(
                f"- stage {stage}: {speed:.2f}x DeepSpeed ({'met' if speed >= 1.3 else 'MISSED'} >= 1.3x); "
                f"peak {ours['peak_GiB']} vs {theirs['peak_GiB']} GiB ({'met' if memory else 'MISSED'} <=)"
            )
    if "cl3" in rows and "fsdp2" in rows:
        speed = rows["cl3"]["tokens_per_s"] / rows["fsdp2"]["tokens_per_s"]
        lines.append(f"- stage 3 vs FSDP2: {speed:.2f}x ({'met' if speed >= 1.0 else 'MISSED'} >= 1x)")
    if "cl0" in rows and "ddp" in rows:
        lines.append(f"- stage 0 vs DDP: {rows['cl0']['tokens_per_s'] / rows['ddp']['tokens_per_s']:.2f}x")
    return lines


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/gpu/zero_report.py RESULTS.jsonl")
    rows = read(Path(sys.argv[1]))
    print("\n".join(table(rows) + [""] + goals(rows)))


if __name__ == "__main__":
    main()
