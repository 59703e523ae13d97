"""Sharded checkpoints: one file per rank plus shared metadata, written atomically.

Layout of ``save_dir``::

    latest                 the newest tag (replaced atomically)
    <tag>/meta.json        world size, stage, step counters, loss scale, parameter names/shapes
    <tag>/common.pt        optimizer hyperparameters, buffers, state_dict aliases, client state
    <tag>/rank_<r>.pt      rank r's fragments: parameter name, start, values, optimizer state

A save goes to a new version directory beside the current one and ``<tag>`` (a symbolic link)
is switched to it in one atomic rename only after every rank's file is complete, then ``latest``
is replaced; the old version is deleted last. An interrupted save therefore leaves the previous
checkpoint loadable, under any tag, and every file's checksum is verified on load
(:mod:`commlayer.zero.versions`). Fragments are addressed by (parameter name, element range), not by rank,
so a checkpoint loads at any world size and stage: each rank copies the overlap of its new
fragments with the saved ones. :func:`consolidated_state_dict` assembles the plain fp32 model
without any process group.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Protocol

import torch

from commlayer import dist
from commlayer.core.errors import CheckpointError, InvalidArgumentError, UnsupportedError
from commlayer.dist import ProcessGroup
from commlayer.zero import versions as _versions

__all__ = ["CheckpointFallbackWarning", "consolidated_state_dict", "load_checkpoint", "save_checkpoint"]

FORMAT = 1


class CheckpointFallbackWarning(UserWarning):
    """The newest checkpoint was damaged: an older intact one was loaded instead."""


class CheckpointedEngine(Protocol):
    """What a checkpoint reads from and restores into a :class:`~commlayer.zero.ZeroEngine`."""

    config: Any
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    param_names: list[str]
    param_dtypes: list[torch.dtype]
    train_dtype: torch.dtype
    master: Any
    layout: Any
    runtime: Any
    experts: Any
    scaler: Any
    global_steps: int
    micro_steps: int
    skipped_steps: int
    group_rank: int
    group_size: int
    replica_rank: int
    data_parallel_group: ProcessGroup

    def full_state_dict(self) -> dict[str, torch.Tensor]: ...

    def zero_grad(self) -> None: ...


# --- saving ----------------------------------------------------------------------------------


def save_checkpoint(
    engine: CheckpointedEngine, save_dir: str | os.PathLike, tag: str | None, client_state: dict | None
) -> str:
    """Write the engine's state under ``save_dir/tag`` (collective); returns the tag."""
    _require_whole_world(engine, "save_checkpoint")
    tag = tag or f"global_step{engine.global_steps}"
    # With hybrid sharding one replica's shards hold everything: the other replicas write nothing.
    root, rank, writer = Path(save_dir), engine.group_rank, engine.replica_rank == 0
    # Every rank reads the same link here: it only changes after the last barrier below.
    version = _versions.next_version(root, tag)
    everyone = engine.data_parallel_group
    if rank == 0 and writer:
        shutil.rmtree(version, ignore_errors=True)
        version.mkdir(parents=True)
    dist.barrier(group=everyone)
    if writer:
        _save_checked(_rank_payload(engine), version / f"rank_{rank}.pt")
    if engine.config.zero_optimization.stage3_gather_16bit_weights_on_model_save:
        weights = {
            k: v.to(engine.train_dtype) if v.is_floating_point() else v
            for k, v in engine.full_state_dict().items()
        }
        if rank == 0 and writer:
            _save_checked(weights, version / "model_16bit.pt")
    dist.barrier(group=everyone)
    if rank == 0 and writer:
        _save_checked(_common_payload(engine, client_state), version / "common.pt")
        meta = {**_meta(engine), "checksums": _versions.collect_checksums(version)}
        _atomic_write(version / "meta.json", json.dumps(meta, indent=1))
        _versions.publish(root, tag, version)
        _atomic_write(root / "latest", tag)
    dist.barrier(group=everyone)
    return tag


def _rank_payload(engine: CheckpointedEngine) -> dict[str, Any]:
    optimizer_state = {
        id(t): engine.optimizer.state.get(t, {}) for _, t in engine.master.trainable_fragments(engine.params)
    }
    fragments = []
    # Unsharded (stage 0): every rank holds everything, so rank 0 alone writes it.
    replica = engine.layout.shards == 1 and engine.group_rank != 0
    for fragment, values in zip(engine.master.fragments, engine.master.fragment_values):
        if replica:
            break
        state = optimizer_state.get(id(values), {})
        fragments.append(
            {
                "param": engine.param_names[fragment.param],
                "start": fragment.start,
                "numel": fragment.numel,
                "values": values.detach().reshape(-1).cpu().clone(),
                "state": {key: _to_cpu(value) for key, value in state.items()},
            }
        )
    return {"format": FORMAT, "rank": engine.group_rank, "fragments": fragments}


def _common_payload(engine: CheckpointedEngine, client_state: dict | None) -> dict[str, Any]:
    index_of = {id(p): name for p, name in zip(engine.params, engine.param_names)}
    aliases = {
        key: index_of[id(value)]
        for key, value in engine.module.state_dict(keep_vars=True).items()
        if id(value) in index_of
    }
    buffers = {
        key: value.detach().cpu().clone()
        for key, value in engine.module.state_dict(keep_vars=True).items()
        if key not in aliases
    }
    groups = [
        {key: _to_cpu(value) for key, value in group.items() if key != "params"}
        for group in engine.optimizer.param_groups
    ]
    return {
        "format": FORMAT,
        "param_groups": groups,
        "aliases": aliases,
        "buffers": buffers,
        "client_state": client_state or {},
    }


def _meta(engine: CheckpointedEngine) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "world_size": engine.group_size,
        "stage": engine.config.stage,
        "global_steps": engine.global_steps,
        "micro_steps": engine.micro_steps,
        "skipped_steps": engine.skipped_steps,
        "loss_scaler": engine.scaler.state_dict(),
        "params": [
            {"name": n, "shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
            for n, shape, dtype in zip(engine.param_names, engine.master.shapes, engine.param_dtypes)
        ],
    }


def _to_cpu(value: Any) -> Any:
    return value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value


def _save_checked(payload: Any, path: Path) -> None:
    """torch.save to ``path`` atomically, with its checksum beside it."""
    temporary = path.with_name(path.name + ".tmp")
    torch.save(payload, temporary)
    os.replace(temporary, path)
    _versions.checksum_file(path)


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _require_whole_world(engine: CheckpointedEngine, op: str) -> None:
    if engine.experts is not None:
        raise UnsupportedError(
            f"{op}: checkpoints of expert-parallel MoE models are not supported yet (experts share local "
            f"names across the 'ep' group); save engine.full_state_dict() per rank instead (rank {dist.get_rank()})"
        )
    if engine.data_parallel_group.size() != dist.get_world_size():
        raise InvalidArgumentError(
            f"{op}: checkpoints need the partition group to span the world ({dist.get_world_size()} ranks), "
            f"received a mesh whose data-parallel group has {engine.data_parallel_group.size()} ranks (tensor/pipeline-parallel "
            f"checkpoints are not supported) (rank {dist.get_rank()})"
        )


# --- loading ---------------------------------------------------------------------------------


class _Saved:
    """A checkpoint directory opened for reading; fragments are memory-mapped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.meta = json.loads((self.path / "meta.json").read_text())
        self.common = torch.load(self._checked("common.pt"), map_location="cpu", weights_only=False)
        self.pieces: dict[str, list[dict[str, Any]]] = {}
        for rank in range(self.meta["world_size"]):
            shard = self._checked(f"rank_{rank}.pt", rank)
            payload = torch.load(shard, map_location="cpu", mmap=True, weights_only=True)
            for fragment in payload["fragments"]:
                self.pieces.setdefault(fragment["param"], []).append(fragment)

    @classmethod
    def open(cls, load_dir: str | os.PathLike, tag: str | None) -> _Saved:
        """The checkpoint ``tag``; without one, the newest intact checkpoint: when the one
        ``latest`` names is damaged, the newest older version still on disk, with a warning."""
        root = Path(load_dir)
        if tag is not None:
            return cls(_complete_version(root, tag))
        latest = root / "latest"
        if not latest.is_file():
            raise InvalidArgumentError(
                f"load_checkpoint: argument 'load_dir' expected a checkpoint directory with a 'latest' file, received {str(root)!r}"
            )
        newest = latest.read_text().strip()
        try:
            return cls(_complete_version(root, newest))
        except (CheckpointError, InvalidArgumentError) as damage:
            return cls._fallback(root, newest, damage)

    @classmethod
    def _fallback(cls, root: Path, newest: str, damage: Exception) -> _Saved:
        for version in _older_versions(root, newest):
            try:
                saved = cls(version)
            except (CheckpointError, OSError, RuntimeError, ValueError):
                continue
            warnings.warn(
                f"load_checkpoint: the newest checkpoint {newest!r} in {str(root)!r} cannot be loaded "
                f"({damage}); resuming from {version.name!r} (step {saved.meta.get('global_steps')}), "
                "the newest intact checkpoint",
                CheckpointFallbackWarning,
                stacklevel=4,
            )
            return saved
        raise damage

    def _checked(self, name: str, shard_rank: int | None = None) -> Path:
        """``self.path / name`` once it exists and matches its recorded checksum."""
        path = self.path / name
        reader = dist.get_rank() if dist.is_initialized() else 0
        _versions.verify(path, self.meta.get("checksums", {}).get(name), shard_rank, reader)
        return path

    def assemble(self, name: str, start: int, numel: int, key: str | None) -> torch.Tensor | None:
        """Elements [start, start + numel) of a parameter's values (key None) or state ``key``."""
        out: torch.Tensor | None = None
        for piece in self.pieces.get(name, ()):
            low, high = max(start, piece["start"]), min(start + numel, piece["start"] + piece["numel"])
            source = piece["values"] if key is None else piece["state"].get(key)
            if low >= high or source is None:
                continue
            if out is None:
                out = torch.empty(numel, dtype=source.dtype)
            out[low - start : high - start] = source.reshape(-1)[low - piece["start"] : high - piece["start"]]
        return out

    def scalar_state(self, name: str) -> dict[str, Any]:
        """State entries that are not per-element (e.g. Adam's ``step``), from any fragment."""
        for piece in self.pieces.get(name, ()):
            return {
                k: v
                for k, v in piece["state"].items()
                if not (isinstance(v, torch.Tensor) and v.numel() == piece["numel"] and v.dim() > 0)
            }
        return {}


def _complete_version(root: Path, tag: str) -> Path:
    found = _versions.resolve(root, tag)
    if found is None:
        raise InvalidArgumentError(
            f"load_checkpoint: argument 'tag' expected a complete checkpoint, received {str(root / tag)!r} (no meta.json)"
        )
    return found


def _older_versions(root: Path, newest: str) -> list[Path]:
    """Every other complete version under ``root``, newest first (by when its meta.json was written)."""
    skip = {(root / newest).resolve()}
    found = [meta.parent for meta in root.glob("*/meta.json") if meta.parent.resolve() not in skip]
    found += [meta.parent for meta in root.glob(".*/meta.json") if meta.parent.resolve() not in skip]
    unique: dict[Path, Path] = {}
    for version in found:  # a tag's link before its hidden version directory: messages name the tag
        unique.setdefault(version.resolve(), version)
    return sorted(unique.values(), key=lambda version: (version / "meta.json").stat().st_mtime, reverse=True)


def load_checkpoint(
    engine: CheckpointedEngine, load_dir: str | os.PathLike, tag: str | None, load_optimizer_states: bool
) -> tuple[str, dict]:
    """Load (and reshard, if the world size differs) a checkpoint into ``engine``."""
    _require_whole_world(engine, "load_checkpoint")
    saved = _Saved.open(load_dir, tag)
    _check_params(engine, saved)
    master = engine.master
    for fragment, values in zip(master.fragments, master.fragment_values):
        name = engine.param_names[fragment.param]
        values.view(-1).copy_(saved.assemble(name, fragment.start, fragment.numel, None))
    if load_optimizer_states:
        _load_optimizer(engine, saved)
    engine.global_steps, engine.micro_steps = saved.meta["global_steps"], saved.meta["micro_steps"]
    engine.skipped_steps = saved.meta["skipped_steps"]
    engine.scaler = engine.scaler.with_state(saved.meta["loss_scaler"])
    _load_buffers(engine, saved.common["buffers"])
    engine.zero_grad()
    engine.runtime.refresh_params()
    return str(saved.path), saved.common["client_state"]


def _check_params(engine: CheckpointedEngine, saved: _Saved) -> None:
    have = [(n, list(s)) for n, s in zip(engine.param_names, engine.master.shapes)]
    stored = [(p["name"], p["shape"]) for p in saved.meta["params"]]
    if have != stored:
        differ = [f"{a} vs {b}" for a, b in zip(have, stored) if a != b][:3] or [
            f"{len(have)} vs {len(stored)} parameters"
        ]
        raise InvalidArgumentError(
            f"load_checkpoint: the checkpoint at {str(saved.path)!r} holds a different model: {'; '.join(differ)}"
        )


def _load_optimizer(engine: CheckpointedEngine, saved: _Saved) -> None:
    for group, stored in zip(engine.optimizer.param_groups, saved.common["param_groups"]):
        group.update({key: value for key, value in stored.items() if key in group})
    device = engine.master.values.device
    for fragment, tensor in engine.master.trainable_fragments(engine.params):
        name = engine.param_names[fragment.param]
        state = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in saved.scalar_state(name).items()
        }
        keys = {key for piece in saved.pieces.get(name, ()) for key in piece["state"]} - set(state)
        for key in sorted(keys):
            part = saved.assemble(name, fragment.start, fragment.numel, key)
            if part is not None:
                state[key] = part.to(device).view_as(tensor)
        if state:
            engine.optimizer.state[tensor] = state


def _load_buffers(engine: CheckpointedEngine, buffers: dict[str, torch.Tensor]) -> None:
    current = dict(engine.module.named_buffers())
    for key, value in buffers.items():
        if key in current:
            current[key].copy_(value.to(current[key].dtype))


def consolidated_state_dict(load_dir: str | os.PathLike, tag: str | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's full model as a plain ``state_dict`` (no process group needed).

    ``model.load_state_dict(consolidated_state_dict("ckpt"))`` restores the fp32 weights (in the
    model's original dtypes) and buffers of a model trained at any world size and stage.
    """
    saved = _Saved.open(load_dir, tag)
    weights = {}
    for entry in saved.meta["params"]:
        numel = 1
        for size in entry["shape"]:
            numel *= size
        values = saved.assemble(entry["name"], 0, numel, None)
        assert values is not None, entry["name"]
        weights[entry["name"]] = values.view(entry["shape"]).to(getattr(torch, entry["dtype"]))
    state = {key: weights[name] for key, name in saved.common["aliases"].items()}
    state.update(saved.common["buffers"])
    return state
