"""``commlayer trace export --torch DIR OUT``: one job's dumps in torch's flight-recorder format.

torch's analyzer (``torchfrtrace OUT``, installed with torch) reads one pickle per rank named
``<prefix><rank>``; this writes ``OUT/commlayer_trace_rank_<N>`` with the fields it reads::

    {"version": "2.10", "comm_lib_version": "commlayer", "pg_config": {name: {"name", "desc",
     "ranks": "[0, 1]"}}, "pg_status": {...}, "entries": [{"record_id", "pg_id", "process_group":
     (name, desc), "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name": "gloo:all_reduce",
     "input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "state", "time_created_ns",
     ...}]}

Every commlayer group becomes a process group of that name. torch's analyzer knows only its own
backends' names, so each op is labelled ``gloo:<op>`` whatever backend ran it. commlayer's
point-to-point entries do not record their peer, which torch's format requires, so they are
left out (``commlayer trace analyze`` still lists the pending ones).
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TORCH_DUMP_PREFIX", "TORCH_FORMAT_VERSION", "export_torch", "torch_dump"]

TORCH_DUMP_PREFIX = "commlayer_trace_rank_"
TORCH_FORMAT_VERSION = "2.10"  # the flight-recorder schema version these dumps follow
_LABEL = "gloo"
# commlayer's op -> torch's recorded name.
_TORCH_OPS = {
    "all_gather_into_tensor": "_all_gather_base",
    "reduce_scatter_tensor": "_reduce_scatter_base",
}
_STATES = {"completed": "completed", "started": "started", "failed": "started", "released": "scheduled"}
_DTYPES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
}


def export_torch(dumps: Mapping[int, dict[str, Any]], out: str | Path) -> list[Path]:
    """Write every rank's dump in torch's format into ``out``; returns the files written."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for rank, dump in sorted(dumps.items()):
        path = folder / f"{TORCH_DUMP_PREFIX}{rank}"
        path.write_bytes(pickle.dumps(torch_dump(dump)))
        written.append(path)
    return written


def torch_dump(dump: dict[str, Any]) -> dict[str, Any]:
    """One rank's commlayer dump as the dictionary torch's flight recorder pickles."""
    groups = dump.get("groups", [])
    entries: list[dict[str, Any]] = []
    for pg_id, group in enumerate(groups):
        for entry in group["entries"]:
            if not entry["op"].startswith("p2p:"):
                entries.append(_torch_entry(entry, pg_id, group, dump))
    entries.sort(key=lambda item: item["time_created_ns"])
    for record_id, entry in enumerate(entries):
        entry["record_id"] = entry["op_id"] = record_id
    return {
        "version": TORCH_FORMAT_VERSION,
        "comm_lib_version": "commlayer",
        "pg_config": {
            group["group"]: {
                "name": group["group"],
                "desc": group["group"],
                "ranks": str(list(group["ranks"])),
            }
            for group in groups
        },
        "pg_status": {
            str(pg_id): {
                "last_enqueued_collective": group["last_collective"],
                "last_started_collective": group["last_collective"],
                "last_completed_collective": _last_completed(group),
            }
            for pg_id, group in enumerate(groups)
        },
        "entries": entries,
    }


def _torch_entry(
    entry: dict[str, Any], pg_id: int, group: dict[str, Any], dump: dict[str, Any]
) -> dict[str, Any]:
    inputs, outputs = _sizes(entry["op"], entry["shape"], len(group["ranks"]))
    dtype = _DTYPES.get(entry["dtype"], entry["dtype"])
    state = _STATES.get(entry["state"], "scheduled")
    return {
        "record_id": 0,
        "pg_id": pg_id,
        "process_group": (group["group"], group["group"]),
        "collective_seq_id": entry["seq"],
        "p2p_seq_id": 0,
        "op_id": 0,
        "is_p2p": False,
        "profiling_name": f"{_LABEL}:{_TORCH_OPS.get(entry['op'], entry['op'])}",
        "input_sizes": inputs,
        "output_sizes": outputs,
        "input_dtypes": [dtype] * len(inputs),
        "output_dtypes": [dtype] * len(outputs),
        "state": state,
        "retired": state == "completed",
        "time_created_ns": int(entry["queued_ns"]),
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": entry.get("completed_ns"),
        "timeout_ms": 0,
        "frames": [],
        "thread_id": str(dump.get("pid", 0)),
        "thread_name": "commlayer",
    }


def _sizes(op: str, shape: list[Any], size: int) -> tuple[list[list[int]], list[list[int]]]:
    """Input and output sizes as torch records them, from the one payload shape commlayer keeps."""
    shapes = shape if shape and isinstance(shape[0], list) else [shape]
    if op == "reduce_scatter_tensor" and shapes[0]:
        first = shapes[0]
        return [first], [[first[0] // max(size, 1), *first[1:]]]
    if op == "all_gather":
        return [shapes[0]], [[math.prod(shapes[0]) * size]]
    return shapes, shapes


def _last_completed(group: dict[str, Any]) -> int:
    done = [
        entry["seq"]
        for entry in group["entries"]
        if entry["state"] == "completed" and not entry["op"].startswith("p2p:")
    ]
    return max(done, default=0)
