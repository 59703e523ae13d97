"""Checkpoints of a fault-tolerant job: each shard written by one member, no collective at all.

Layout of ``directory``::

    step_00000040/shard0-of-2.pt    the master shard, its optimizer state, the step, and the
    step_00000040/shard1-of-2.pt    names and shapes of the parameters (to assemble the model)

A shard is written by its member of the first replica that trained the step, to a temporary name
that is fsynced and renamed into place, so a file that exists is whole. The checkpoint is the newest step
all of whose shards exist: a member that dies while saving leaves that step incomplete and the one
before stays the checkpoint. A writer removes steps older than the ``keep`` newest complete ones.
:func:`read_parameters` assembles the model's parameters without any process group.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from commlayer.core.errors import CheckpointError

__all__ = ["FORMAT", "complete_steps", "newest_shard", "read_parameters", "write_shard"]

FORMAT = 1
_STEP = re.compile(r"step_(\d+)")


def write_shard(
    directory: str | os.PathLike, step: int, shard: int, shards: int, payload: dict[str, Any], keep: int = 2
) -> Path:
    """Write ``payload`` as shard ``shard`` of ``shards`` at ``step``; returns the file."""
    folder = Path(directory) / f"step_{step:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"shard{shard}-of-{shards}.pt"
    temporary = folder / f".{path.name}.{os.getpid()}.tmp"
    torch.save({"format": FORMAT, "step": step, **_to_cpu(payload)}, temporary)
    with open(temporary, "rb") as written:
        os.fsync(written.fileno())
    os.replace(temporary, path)
    if shard == 0:
        _prune(Path(directory), shards, keep)
    return path


def newest_shard(
    directory: str | os.PathLike, shard: int, shards: int, device: torch.device
) -> tuple[int, dict[str, Any], Path] | None:
    """``(step, payload, file)`` of shard ``shard`` in the newest complete checkpoint that reads
    back (an unreadable one is skipped with a warning), or None when there is none."""
    for step, folder in complete_steps(Path(directory), shards):
        path = folder / f"shard{shard}-of-{shards}.pt"
        try:
            payload = torch.load(path, map_location=device, weights_only=True)
        except Exception as damage:  # noqa: BLE001 - a damaged file raises whatever unpickling hits
            warnings.warn(
                f"commlayer.ft: {path} is unreadable ({damage}); trying an older checkpoint", stacklevel=3
            )
            continue
        return step, payload, path
    return None


def read_parameters(directory: str | os.PathLike) -> tuple[int, dict[str, torch.Tensor]]:
    """The newest complete checkpoint's step and parameters by name (fp32 master values), read
    without any process group.

    Raises:
        CheckpointError: ``directory`` holds no complete checkpoint.
    """
    root = Path(directory)
    for shards in _shard_counts(root):
        for step, folder in complete_steps(root, shards):
            parts = [
                torch.load(folder / f"shard{s}-of-{shards}.pt", weights_only=True) for s in range(shards)
            ]
            flat = torch.cat([part["master"].reshape(-1) for part in parts])
            parameters, offset = {}, 0
            for name, shape in parts[0]["names"]:
                count = int(torch.Size(shape).numel())
                parameters[name] = flat[offset : offset + count].reshape(shape).clone()
                offset += count
            return step, parameters
    raise CheckpointError(f"commlayer.ft: {root} holds no complete checkpoint (step_<N>/shard<S>-of-<K>.pt)")


def complete_steps(directory: Path, shards: int) -> Iterator[tuple[int, Path]]:
    """``(step, folder)`` of every step with all ``shards`` files, newest first."""
    found = []
    if directory.is_dir():
        for folder in directory.iterdir():
            match = _STEP.fullmatch(folder.name)
            if match and all((folder / f"shard{s}-of-{shards}.pt").exists() for s in range(shards)):
                found.append((int(match.group(1)), folder))
    yield from sorted(found, reverse=True)


def _prune(directory: Path, shards: int, keep: int) -> None:
    complete = [folder for _, folder in complete_steps(directory, shards)]
    if len(complete) <= keep:
        return
    oldest_kept = int(_STEP.fullmatch(complete[keep - 1].name).group(1))  # type: ignore[union-attr]
    for folder in directory.iterdir():
        match = _STEP.fullmatch(folder.name)
        if match and int(match.group(1)) < oldest_kept:
            shutil.rmtree(folder, ignore_errors=True)


def _shard_counts(directory: Path) -> list[int]:
    counts = set()
    for file in directory.glob("step_*/shard*-of-*.pt"):
        counts.add(int(file.stem.rsplit("-of-", 1)[1]))
    return sorted(counts)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_cpu(item) for item in value]
    return value
