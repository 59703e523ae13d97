"""``commlayer bench`` streams: each row appears as it is measured (in a pipe too), progress lines
replace the bar off a terminal, every output file is announced, and the JSON says where and how
it was measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multirank

ROOT = Path(__file__).resolve().parents[2]


def test_rows_stream_through_a_pipe_and_files_are_announced(tmp_path: Path) -> None:
    target = tmp_path / "bench.json"
    # Two sizes: 8 B, then 16 MiB (the slow one). Progress lines at every step, merged in order.
    argv = ["bench", "-n", "2", "--backends", "gloo", "--ops", "all_reduce", "-b", "8", "-e", "16M"]
    argv += ["-f", str(2**21), "--iters", "5", "--warmup", "1", "--json", str(target)]
    env = {**os.environ, "COMMLAYER_BENCH_PROGRESS_EVERY": "0"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    process = subprocess.Popen(
        [sys.executable, "-m", "commlayer", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    seen: list[str] = []
    running_at_first_row = None
    for line in process.stdout:  # read as it arrives
        seen.append(line.rstrip("\n"))
        if running_at_first_row is None and line.split()[:1] == ["8"]:
            running_at_first_row = process.poll() is None
    assert process.wait(timeout=300) == 0, "\n".join(seen)
    transcript = "\n".join(seen)
    first_row = next(i for i, line in enumerate(seen) if line.split()[:1] == ["8"])
    second_size_done = seen.index("commlayer bench: 2/2 steps, gloo all_reduce 16777216B")
    assert running_at_first_row and first_row < second_size_done, transcript
    assert seen.index("commlayer bench: 1/2 steps, gloo all_reduce 8B") < second_size_done, transcript
    assert f"wrote {target}" in seen, transcript
    document = json.loads(target.read_text())
    metadata = document["metadata"]
    assert {"host", "cpu", "gpus", "python", "torch", "commlayer", "date", "command"} <= set(metadata)
    assert metadata["command"].startswith("commlayer bench -n 2 --backends gloo"), metadata
    assert [(row["op"], row["bytes"]) for row in document["records"]] == [
        ("all_reduce", 8),
        ("all_reduce", 2**24),
    ]
