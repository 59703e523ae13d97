"""Results of benchmarks/gpu/frameworks.sh: one JSON line per run, then the comparison table.

    python3 frameworks_report.py --line RUN BACKEND EXIT_CODE OUTPUT_FILE   # one results.jsonl line
    python3 frameworks_report.py results.jsonl                             # the markdown table

A run's line holds the anchor's JSON (tokens/s, step ms, peak GiB, loss) or, for torchtitan, the
mean tokens/s per GPU over the steps after the first quarter and the last step's loss, as
torchtitan logs them; a failed run holds its exit code and last error line.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TITAN_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+).*?tps:\s*([0-9,]+)")


def line(run: str, backend: str, code: int, output: str) -> dict[str, object]:
    text = _ANSI.sub("", output)
    result: dict[str, object] = {"run": run, "backend": backend, "exit_code": code}
    if run.startswith("titan"):
        steps = [
            (int(s), float(loss), int(tps.replace(",", ""))) for s, loss, tps in _TITAN_STEP.findall(text)
        ]
        if steps:
            measured = steps[len(steps) // 4 :] or steps
            result.update(
                steps=steps[-1][0],
                loss=steps[-1][1],
                tokens_per_s_per_gpu=round(sum(tps for _, _, tps in measured) / len(measured)),
            )
    else:
        rows = [json.loads(row) for row in text.splitlines() if row.startswith("{")]
        if rows:
            result.update(rows[-1])
    groups = re.findall(r"process group: (\w+)", text)
    if groups:
        result["process_group"] = groups[-1]
    if code != 0 or len(result) <= 4:
        errors = [row for row in text.splitlines() if "Error" in row or "error" in row]
        tail = errors or text.strip().splitlines() or [""]
        result["error"] = tail[-1][-300:]
    return result


def table(path: Path) -> str:
    rows = [json.loads(row) for row in path.read_text().splitlines() if row.strip()]
    by_run: dict[str, dict[str, dict[str, object]]] = {}
    for row in rows:
        by_run.setdefault(str(row["run"]), {})[str(row["backend"])] = row
    lines = [
        "| run | NCCL tokens/s | commlayer tokens/s | ratio | NCCL loss | commlayer loss | peak GiB (NCCL / commlayer) |",
        "|---|---|---|---|---|---|---|",
    ]
    for run, results in by_run.items():
        nccl, ours = results.get("nccl", {}), results.get("commlayer", {})
        speed = [r.get("tokens_per_s", r.get("tokens_per_s_per_gpu")) for r in (nccl, ours)]
        ratio = f"{speed[1] / speed[0]:.3f}" if all(isinstance(s, (int, float)) and s for s in speed) else "-"
        failed = [f"{name}: {r.get('error')}" for name, r in results.items() if r.get("exit_code")]
        lines.append(
            f"| {run} | {speed[0] or '-'} | {speed[1] or '-'} | {ratio} | {nccl.get('loss', '-')} | "
            f"{ours.get('loss', '-')} | {nccl.get('peak_GiB', '-')} / {ours.get('peak_GiB', '-')} |"
            + (f" failed: {'; '.join(failed)}" if failed else "")
        )
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1] == "--line":
        run, backend, code, output = sys.argv[2:6]
        print(json.dumps(line(run, backend, int(code), Path(output).read_text(errors="replace"))))
    else:
        print(table(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
