"""Checkpoint versions on disk: written beside the old one, switched by one atomic rename, verified.

A tag is a symbolic link to one of two version directories, ``.<tag>.A`` and ``.<tag>.B``::

    ckpt/step100 -> .step100.A        the version every reader sees
    ckpt/.step100.B/                  the next save of this tag is written here

A save fills the slot the link does not point to, then replaces the link (``rename(2)`` of a
new link over the old one is atomic), and only then deletes the previous version. A crash at
any point leaves the tag pointing at a complete version; a crash between the switch and the
delete only leaves a stale directory, removed by the next save. Every file carries a SHA-256
checksum (``<file>.sha256`` while writing, collected into meta.json), verified on load: a damaged
or missing shard fails naming the file and the rank that wrote it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from commlayer.core.errors import CheckpointError

__all__ = ["checksum_file", "collect_checksums", "next_version", "publish", "resolve", "verify"]

_SLOTS = ("A", "B")
_CHUNK = 1 << 22


def _slot_dir(root: Path, tag: str, slot: str) -> Path:
    return root / f".{tag}.{slot}"


def next_version(root: Path, tag: str) -> Path:
    """The version directory the next save of ``tag`` writes (the one not published)."""
    link = root / tag
    if link.is_symlink():
        current = os.readlink(link)
    else:  # no link (first save, or a crash while converting a legacy tag): keep the newest version
        newest = resolve(root, tag)
        current = None if newest is None else newest.name
    free = next(slot for slot in _SLOTS if current != _slot_dir(root, tag, slot).name)
    return _slot_dir(root, tag, free)


def checksum_file(path: Path) -> str:
    """Write ``<path>.sha256`` next to ``path`` and return the digest."""
    digest = _sha256(path)
    sidecar = path.with_name(path.name + ".sha256")
    partial = sidecar.with_name(sidecar.name + ".tmp")
    partial.write_text(digest)
    os.replace(partial, sidecar)
    return digest


def collect_checksums(version: Path) -> dict[str, str]:
    """Every ``<file>.sha256`` of ``version``, by file name (for meta.json)."""
    return {
        sidecar.name[: -len(".sha256")]: sidecar.read_text().strip() for sidecar in version.glob("*.sha256")
    }


def publish(root: Path, tag: str, version: Path) -> None:
    """Point ``root/tag`` at ``version`` atomically, then delete the version it replaced."""
    link = root / tag
    previous = _previous_version(root, tag, link)
    fresh = root / f".{tag}.link"
    if fresh.is_symlink() or fresh.exists():
        fresh.unlink()
    fresh.symlink_to(version.name)
    if link.is_dir() and not link.is_symlink():  # a tag written before versions existed
        legacy = _slot_dir(root, tag, "legacy")
        shutil.rmtree(legacy, ignore_errors=True)
        os.replace(link, legacy)  # resolve() finds the newest complete version if we die here
        previous = legacy
    os.replace(fresh, link)
    if previous is not None and previous != version:
        shutil.rmtree(previous, ignore_errors=True)


def _previous_version(root: Path, tag: str, link: Path) -> Path | None:
    if link.is_symlink():
        return root / os.readlink(link)
    return None


def resolve(root: Path, tag: str) -> Path | None:
    """The complete version of ``tag``: where its link points, else the newest complete slot."""
    link = root / tag
    if (link / "meta.json").is_file():
        return link
    slots = [_slot_dir(root, tag, slot) for slot in (*_SLOTS, "legacy")]
    complete = [slot for slot in slots if (slot / "meta.json").is_file()]
    return max(complete, key=lambda slot: (slot / "meta.json").stat().st_mtime, default=None)


def verify(path: Path, expected: str | None, shard_rank: int | None, reader_rank: int) -> None:
    """Raise CheckpointError unless ``path`` exists and (when known) has the recorded checksum."""
    written_by = "" if shard_rank is None else f", written by rank {shard_rank},"
    if not path.is_file():
        raise CheckpointError(
            f"load_checkpoint: checkpoint file '{path}'{written_by} is missing (rank {reader_rank})"
        )
    if expected is None:
        return
    actual = _sha256(path)
    if actual != expected:
        raise CheckpointError(
            f"load_checkpoint: checkpoint file '{path}'{written_by} is damaged: its SHA-256 is "
            f"{actual[:16]}..., meta.json recorded {expected[:16]}... (rank {reader_rank})"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()
