"""The ZeRO engine's configuration: DeepSpeed's JSON keys as a frozen pydantic model.

``load_config({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}})``, or a
path to a JSON file. Unknown keys are rejected with the list of valid ones; deprecated keys are
rewritten to their new names with a FutureWarning (the idea of DeepSpeed's config models, in our
own code: each model declares its :class:`Deprecated` keys and a before-validator migrates them,
so the new field is validated as if the user had written it). The batch keys are reconciled with
the data-parallel size by :func:`resolve_batch_sizes`, with DeepSpeed's arithmetic.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from commlayer.core.errors import InvalidArgumentError

__all__ = [
    "BF16Config",
    "BatchSizes",
    "Deprecated",
    "FP16Config",
    "ZeroConfig",
    "ZeroConfigError",
    "ZeroOptimizationConfig",
    "load_config",
    "resolve_batch_sizes",
]

MANY = 500_000_000  # DeepSpeed's default bucket sizes, in elements


class ZeroConfigError(InvalidArgumentError):
    """The configuration was rejected before the engine communicated at all."""


@dataclass(frozen=True)
class Deprecated:
    """``old`` is migrated to ``new`` (a dotted path inside the same model), through ``convert``."""

    old: str
    new: str
    convert: Callable[[Any], Any] = lambda value: value


class _Section(BaseModel):
    """Base of every config section: frozen, strict about keys, migrating deprecated ones."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, populate_by_name=True)
    deprecated_keys: ClassVar[tuple[Deprecated, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _migrate_then_check_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for entry in cls.deprecated_keys:
            if entry.old in data:
                _migrate(cls.__name__, data, entry)
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            valid = ", ".join(sorted(cls.model_fields))
            raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; valid keys are: {valid}")
        return data


def _migrate(section: str, data: dict[str, Any], entry: Deprecated) -> None:
    *parents, leaf = entry.new.split(".")
    target = data
    for parent in parents:
        target = target.setdefault(parent, {})
        if not isinstance(target, dict):
            # pydantic reports a validator's ValueError as a config error, but lets a TypeError escape.
            raise ValueError(  # noqa: TRY004
                f"cannot migrate deprecated key {entry.old!r} into {entry.new!r}: {parent!r} is not a section"
            )
    if leaf in target:
        raise ValueError(
            f"give either the deprecated key {entry.old!r} or its replacement {entry.new!r}, not both"
        )
    warnings.warn(
        f"config key {entry.old!r} is deprecated; use {entry.new!r} instead", FutureWarning, stacklevel=2
    )
    target[leaf] = entry.convert(data.pop(entry.old))


class ZeroOptimizationConfig(_Section):
    """``zero_optimization``: the stage and how gradients and parameters move."""

    stage: Literal[0, 1, 2, 3] = 0
    #: Elements per gradient bucket (stages 0-2): a bucket is reduced as soon as it is full.
    reduce_bucket_size: int = Field(MANY, gt=0)
    #: Elements per parameter all-gather after the optimizer step (stages 1-2).
    allgather_bucket_size: int = Field(MANY, gt=0)
    #: Start each bucket's reduction from the backward hooks, overlapping the rest of backward.
    #: None means on (DeepSpeed turns it on only for stage 3; here it costs nothing elsewhere).
    overlap_comm: bool | None = None
    #: Gradients always land in contiguous flat buffers here; kept for DeepSpeed configs.
    contiguous_gradients: bool = True
    #: Stage 3: elements gathered ahead of the running module (prefetch depth).
    stage3_prefetch_bucket_size: int = Field(50_000_000, ge=0)
    #: Stage 3: a module whose parameters (with its descendants') number at most this is
    #: gathered and freed as one unit; larger ones are split among their children. Each unit
    #: costs hooks, a gather and a reduce-scatter per step on the host: 1e8 keeps a whole
    #: transformer block of width up to ~2800 together (FSDP2's per-block wrapping).
    stage3_max_unit_numel: int = Field(100_000_000, gt=0)
    #: Stage 3: units smaller than this join the root unit, gathered once per step.
    stage3_min_unit_numel: int = Field(100_000, ge=0)
    #: Stage 3: consecutive blocks of a ``ModuleList`` or ``Sequential`` (whole units) are
    #: gathered and freed as one unit while together they hold at most this many elements:
    #: fewer, larger collectives a step, about as much memory gathered at once as the prefetch
    #: holds anyway. 0: one unit per module, as FSDP2 wraps each block.
    stage3_coalesce_numel: int = Field(50_000_000, ge=0)
    #: MiCS-style hybrid sharding: shard inside consecutive groups of this many data-parallel
    #: ranks (e.g. the GPUs of a node) and replicate across the groups; -1 (default): shard
    #: across the whole data-parallel group. ``initialize(mesh=..., replicate_dims=...)`` is the
    #: mesh spelling of the same thing.
    mics_shard_size: int = Field(-1, ge=-1)
    #: save_checkpoint also writes the gathered 16-bit weights (rank 0) as ``model_16bit.pt``.
    stage3_gather_16bit_weights_on_model_save: bool = False

    deprecated_keys: ClassVar[tuple[Deprecated, ...]] = (
        Deprecated("stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"),
    )

    @field_validator("mics_shard_size")
    @classmethod
    def _positive_or_off(cls, value: int) -> int:
        if value == 0:
            raise ValueError("mics_shard_size must be a positive number of ranks, or -1 (off)")
        return value

    @property
    def overlap(self) -> bool:
        return True if self.overlap_comm is None else self.overlap_comm


class BF16Config(_Section):
    enabled: bool = False


class FP16Config(_Section):
    """``fp16``: half precision with a static (``loss_scale > 0``) or dynamic loss scale."""

    enabled: bool = False
    loss_scale: float = Field(0.0, ge=0)
    initial_scale_power: int = Field(16, ge=0, le=64)
    loss_scale_window: int = Field(1000, gt=0)
    hysteresis: int = Field(2, gt=0)
    consecutive_hysteresis: bool = False
    min_loss_scale: float = Field(1.0, gt=0)

    @property
    def dynamic(self) -> bool:
        return self.loss_scale == 0


class ZeroConfig(_Section):
    """The whole configuration; DeepSpeed's key names and defaults unless noted."""

    train_batch_size: int | None = Field(None, gt=0)
    train_micro_batch_size_per_gpu: int | None = Field(None, gt=0)
    gradient_accumulation_steps: int | None = Field(None, gt=0)
    gradient_clipping: float = Field(0.0, ge=0)
    #: Dtype of gradient reductions; None: the training dtype.
    communication_data_type: Literal["fp32", "fp16", "bf16"] | None = None
    #: Optimizers other than the element-wise torch ones need this for stages >= 1.
    zero_allow_untested_optimizer: bool = False
    #: Log the loss every this many optimizer steps (None: never).
    steps_per_print: int | None = Field(None, gt=0)
    zero_optimization: ZeroOptimizationConfig = ZeroOptimizationConfig()
    bf16: BF16Config = BF16Config()
    fp16: FP16Config = FP16Config()

    deprecated_keys: ClassVar[tuple[Deprecated, ...]] = (Deprecated("bfloat16", "bf16"),)

    @field_validator("zero_optimization", mode="before")
    @classmethod
    def _legacy_boolean_zero(cls, value: Any) -> Any:
        """Early DeepSpeed configs wrote ``"zero_optimization": true`` for stage 1."""
        if isinstance(value, bool):
            warnings.warn(
                "'zero_optimization': true/false is deprecated; use {'stage': 1} or {'stage': 0}",
                FutureWarning,
                stacklevel=2,
            )
            return {"stage": int(value)}
        return value

    @model_validator(mode="after")
    def _one_precision(self) -> ZeroConfig:
        if self.fp16.enabled and self.bf16.enabled:
            raise ValueError("fp16.enabled and bf16.enabled are both true; enable at most one")
        return self

    @property
    def stage(self) -> int:
        return self.zero_optimization.stage

    @property
    def train_dtype(self) -> torch.dtype:
        if self.bf16.enabled:
            return torch.bfloat16
        return torch.float16 if self.fp16.enabled else torch.float32

    @property
    def reduce_dtype(self) -> torch.dtype:
        names = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        return (
            self.train_dtype if self.communication_data_type is None else names[self.communication_data_type]
        )


def load_config(config: ZeroConfig | dict[str, Any] | str | Path) -> ZeroConfig:
    """A validated :class:`ZeroConfig` from a dict, a JSON file path, or a config."""
    if isinstance(config, ZeroConfig):
        return config
    if isinstance(config, (str, Path)):
        config = _read_json(Path(config))
    if not isinstance(config, dict):
        raise ZeroConfigError(
            f"initialize: argument 'config' expected a dict or a JSON file path, received {type(config).__name__}"
        )
    try:
        return ZeroConfig.model_validate(config)
    except ValidationError as error:
        raise ZeroConfigError(_describe(error)) from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except OSError as error:
        raise ZeroConfigError(
            f"initialize: argument 'config' expected a readable JSON file, received {str(path)!r} ({error.strerror})"
        ) from None
    except json.JSONDecodeError as error:
        raise ZeroConfigError(f"initialize: config file {str(path)!r} is not valid JSON: {error}") from None


def _describe(error: ValidationError) -> str:
    lines = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        message = problem["msg"].removeprefix("Value error, ")
        quote_input = problem["loc"] and "unknown key" not in message
        lines.append(
            f"  {where}: {message}" + (f" (received {problem.get('input')!r})" if quote_input else "")
        )
    return "invalid ZeRO config:\n" + "\n".join(lines)


# --- batch sizes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchSizes:
    train_batch_size: int
    micro_batch_size: int
    gradient_accumulation_steps: int


def resolve_batch_sizes(config: ZeroConfig, dp_size: int) -> BatchSizes:
    """Fill in the missing batch keys from ``train = micro * accumulation * dp_size``.

    DeepSpeed's arithmetic: with two keys given the third is derived by integer division (so an
    inconsistent pair is caught by the final check); with only ``train_batch_size`` the
    accumulation is 1; with only the micro batch, too. Example, dp_size 4: ``train_batch_size=32,
    train_micro_batch_size_per_gpu=2`` gives 4 accumulation steps; ``train_batch_size=30`` with
    the same micro batch fails because 2 * 3 * 4 = 24 != 30.
    """
    train, micro, accumulation = (
        config.train_batch_size,
        config.train_micro_batch_size_per_gpu,
        config.gradient_accumulation_steps,
    )
    if train is None and micro is None:
        raise ZeroConfigError(
            "config: either train_batch_size or train_micro_batch_size_per_gpu must be given"
        )
    if train is not None and micro is not None and accumulation is None:
        accumulation = train // micro // dp_size
    elif train is not None and micro is None:
        accumulation = accumulation or 1
        micro = train // dp_size // accumulation
    elif train is None:
        accumulation = accumulation or 1
        train = micro * accumulation * dp_size
    assert train is not None and micro is not None and accumulation is not None
    if micro < 1 or accumulation < 1 or train != micro * accumulation * dp_size:
        raise ZeroConfigError(
            "config: train_batch_size must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
            f"data-parallel size, received {train} but {micro} * {accumulation} * {dp_size} = {micro * accumulation * dp_size} (given: "
            f"train_batch_size={config.train_batch_size}, train_micro_batch_size_per_gpu="
            f"{config.train_micro_batch_size_per_gpu}, gradient_accumulation_steps={config.gradient_accumulation_steps})"
        )
    return BatchSizes(train, micro, accumulation)
