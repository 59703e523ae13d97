"""Tier 1 (pure logic) for ZeRO: config, batch arithmetic, shard layout, stage-3 units, loss scaler."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from commlayer.zero.config import ZeroConfigError, load_config, resolve_batch_sizes
from commlayer.zero.partition import bucket_indices, build_layout
from commlayer.zero.scaler import LossScaler
from commlayer.zero.units import plan_units

# --- config ----------------------------------------------------------------------------------


def test_defaults_follow_deepspeed() -> None:
    config = load_config({"train_micro_batch_size_per_gpu": 4})
    zero = config.zero_optimization
    assert (config.stage, zero.reduce_bucket_size, zero.allgather_bucket_size, zero.contiguous_gradients) == (
        0,
        500_000_000,
        500_000_000,
        True,
    )
    fp16 = config.fp16
    assert (
        fp16.enabled,
        fp16.loss_scale,
        fp16.initial_scale_power,
        fp16.loss_scale_window,
        fp16.hysteresis,
        fp16.min_loss_scale,
    ) == (False, 0.0, 16, 1000, 2, 1.0)
    assert config.train_dtype == torch.float32 and config.gradient_clipping == 0.0


def test_json_file_and_float_bucket_sizes(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps(
            {
                "train_batch_size": 8,
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e7},
            }
        )
    )
    config = load_config(str(path))
    assert (
        config.stage == 3
        and config.zero_optimization.reduce_bucket_size == 50_000_000
        and config.train_dtype == torch.bfloat16
    )
    assert config.reduce_dtype == torch.bfloat16
    assert (
        load_config(
            {"train_batch_size": 8, "bf16": {"enabled": True}, "communication_data_type": "fp32"}
        ).reduce_dtype
        == torch.float32
    )


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (
            {"train_batch_size": 8, "zero_optimisation": {}},
            "unknown key(s) 'zero_optimisation'; valid keys are: bf16, communication_data_type",
        ),
        (
            {"train_batch_size": 8, "fp16": {"enabled": True, "scale": 2}},
            "fp16: unknown key(s) 'scale'; valid keys are: consecutive_hysteresis, enabled",
        ),
        (
            {"train_batch_size": 8, "zero_optimization": {"stage": 4}},
            "zero_optimization.stage: Input should be 0, 1, 2 or 3 (received 4)",
        ),
        ({"train_batch_size": 8, "fp16": {"enabled": True}, "bf16": {"enabled": True}}, "enable at most one"),
        (
            {"train_batch_size": 8, "gradient_clipping": -1},
            "gradient_clipping: Input should be greater than or equal to 0",
        ),
        (
            {"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 1.5}},
            "reduce_bucket_size: Input should be a valid integer",
        ),
    ],
)
def test_bad_config_lists_what_is_valid(raw: dict, fragment: str) -> None:
    with pytest.raises(ZeroConfigError) as raised:
        load_config(raw)
    assert fragment in str(raised.value)


def test_missing_or_broken_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ZeroConfigError, match="expected a readable JSON file"):
        load_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{stage: 1")
    with pytest.raises(ZeroConfigError, match="is not valid JSON"):
        load_config(tmp_path / "bad.json")


def test_deprecated_keys_migrate_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match="'bfloat16' is deprecated; use 'bf16'"):
        assert load_config({"train_batch_size": 8, "bfloat16": {"enabled": True}}).bf16.enabled
    old = {
        "train_batch_size": 8,
        "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": True},
    }
    with pytest.warns(FutureWarning, match="stage3_gather_16bit_weights_on_model_save"):
        assert load_config(old).zero_optimization.stage3_gather_16bit_weights_on_model_save
    with pytest.warns(FutureWarning, match="'zero_optimization': true/false is deprecated"):
        assert load_config({"train_batch_size": 8, "zero_optimization": True}).stage == 1
    with pytest.raises(
        ZeroConfigError, match="either the deprecated key 'bfloat16' or its replacement 'bf16', not both"
    ):
        load_config({"train_batch_size": 8, "bfloat16": {"enabled": True}, "bf16": {"enabled": True}})


def test_config_is_frozen() -> None:
    config = load_config({"train_batch_size": 8})
    with pytest.raises(Exception, match="frozen"):
        config.gradient_clipping = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("given", "dp", "expected"),
    [
        (
            {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4},
            4,
            (32, 2, 4),
        ),
        ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2}, 4, (32, 2, 4)),
        ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
        ({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5}, 2, (30, 3, 5)),
        ({"train_batch_size": 12}, 3, (12, 4, 1)),
        ({"train_micro_batch_size_per_gpu": 6}, 2, (12, 6, 1)),
    ],
)
def test_batch_arithmetic(given: dict, dp: int, expected: tuple[int, int, int]) -> None:
    sizes = resolve_batch_sizes(load_config(given), dp)
    assert (sizes.train_batch_size, sizes.micro_batch_size, sizes.gradient_accumulation_steps) == expected


@pytest.mark.parametrize(
    ("given", "dp", "fragment"),
    [
        ({}, 2, "either train_batch_size or train_micro_batch_size_per_gpu must be given"),
        ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 2}, 4, "received 30 but 2 * 3 * 4 = 24"),
        (
            {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3},
            4,
            "received 32 but 2 * 3 * 4 = 24",
        ),
        ({"train_batch_size": 4}, 8, "received 4 but 0 * 1 * 8 = 0"),
    ],
)
def test_inconsistent_batch_sizes_fail(given: dict, dp: int, fragment: str) -> None:
    with pytest.raises(ZeroConfigError) as raised:
        resolve_batch_sizes(load_config(given), dp)
    assert fragment in str(raised.value)


# --- layout ----------------------------------------------------------------------------------


def test_docstring_example_of_the_layout() -> None:
    layout = build_layout([[0, 1, 2]], [5, 3, 6], shards=2, alignment=4)
    assert (layout.segments[0].padded_numel, layout.shard_numel) == (16, 8)
    assert [(f.param, f.start, f.numel, f.master_offset) for f in layout.fragments(0)] == [
        (0, 0, 5, 0),
        (1, 0, 3, 5),
    ]
    assert [(f.param, f.start, f.numel, f.master_offset) for f in layout.fragments(1)] == [(2, 0, 6, 0)]


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7])
def test_fragments_cover_every_element_exactly_once(shards: int) -> None:
    numels = [7, 1, 130, 64, 3, 255, 9]
    layout = build_layout(
        bucket_indices(numels, list(reversed(range(len(numels)))), 200), numels, shards, alignment=8
    )
    covered = {p: torch.zeros(n, dtype=torch.int64) for p, n in enumerate(numels)}
    for rank in range(shards):
        offsets = [f.master_offset for f in layout.fragments(rank)]
        assert offsets == sorted(offsets) and all(o < layout.shard_numel for o in offsets)
        for fragment in layout.fragments(rank):
            covered[fragment.param][fragment.start : fragment.start + fragment.numel] += 1
    assert all(bool((c == 1).all()) for c in covered.values())
    for segment in layout.segments:
        assert segment.padded_numel % (shards * 8) == 0 and segment.padded_numel - segment.numel < shards * 8
    assert layout.shard_numel <= math.ceil(sum(numels) / shards) + len(layout.segments) * 8


def test_buckets_keep_order_and_never_split_a_parameter() -> None:
    assert bucket_indices([5, 3, 6, 20, 1], [4, 3, 2, 1, 0], 8) == [[4], [3], [2], [1, 0]]
    assert bucket_indices([1, 1, 1], [0, 1, 2], 10**9) == [[0, 1, 2]]


# --- stage-3 units ---------------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 16)  # 1600
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16)) for _ in range(3)
        )  # 2128 each
        self.norm = nn.LayerNorm(16)  # 32
        self.head = nn.Linear(16, 100, bias=False)
        self.head.weight = self.embed.weight  # tied


def test_units_split_big_modules_and_merge_small_ones_into_the_root() -> None:
    model = Net()
    params = list(model.parameters())
    plans = plan_units(model, params, max_numel=2500, min_numel=100)
    names = [plan.name for plan in plans]
    assert names == ["", "layers.0", "layers.1", "layers.2"]
    root = {i for i in plans[0].params}
    assert {id(params[i]) for i in root} == {
        id(model.embed.weight),
        id(model.norm.weight),
        id(model.norm.bias),
    }
    assert sorted(i for plan in plans for i in plan.params) == list(range(len(params)))
    finer = plan_units(model, params, max_numel=1100, min_numel=10)
    assert [plan.name for plan in finer] == [
        "",
        "layers.0.0",
        "layers.0.2",
        "layers.1.0",
        "layers.1.2",
        "layers.2.0",
        "layers.2.2",
        "norm",
    ]


def test_coalescing_joins_consecutive_whole_blocks_up_to_the_limit() -> None:
    model = Net()
    params = list(model.parameters())
    single = plan_units(model, params, max_numel=2500, min_numel=100)
    plans = plan_units(model, params, max_numel=2500, min_numel=100, coalesce_numel=2 * 2128)
    assert [plan.name for plan in plans] == ["", "layers.0-1", "layers.2"]
    assert plans[1].modules == (model.layers[0], model.layers[1])
    assert plans[1].params == (*single[1].params, *single[2].params)
    assert sorted(i for plan in plans for i in plan.params) == list(range(len(params)))
    everything = plan_units(model, params, max_numel=2500, min_numel=100, coalesce_numel=10**9)
    assert [plan.name for plan in everything] == ["", "layers.0-2"]


def test_coalescing_leaves_split_modules_and_plain_children_apart() -> None:
    """The pieces of a block too big for one unit run in its own forward's order, and the children
    of a plain module in whatever order it calls them: neither is joined."""
    model = Net()
    params = list(model.parameters())
    finer = plan_units(model, params, max_numel=1100, min_numel=10, coalesce_numel=10**9)
    assert [plan.name for plan in finer] == [plan.name for plan in plan_units(model, params, 1100, 10)]
    with torch.device("meta"):
        sequential = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 16), nn.Linear(16, 16))
    plans = plan_units(sequential, list(sequential.parameters()), 5000, 10, coalesce_numel=1900)
    assert [plan.name for plan in plans] == ["", "0-1", "2"]  # 1600 + 272 fit, a third does not


class _Block(nn.Module):
    """The parameters of a GPT block (shared/anchors/zero_anchor.py's), 12 w^2 + 13 w of them."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)


def test_default_units_keep_a_whole_transformer_block_of_the_2_68b_model_together() -> None:
    """Width 2560: one unit per block (as FSDP2 wraps it), not four (qkv, proj, fc, out), which
    made stage 3 host-bound on GPUs (benchmarks/RESULTS.md)."""
    config = load_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    zero, width = config.zero_optimization, 2560
    with torch.device("meta"):  # sizes only: no memory for 160M parameters
        model = nn.Sequential(nn.Embedding(32000, width), _Block(width), _Block(width))
    params = list(model.parameters())
    limits = (zero.stage3_max_unit_numel, zero.stage3_min_unit_numel, zero.stage3_coalesce_numel)
    plans = plan_units(model, params, *limits)
    assert [plan.name for plan in plans] == ["", "0", "1", "2"]  # 78.7M blocks: too big to join
    block = 12 * width * width + 13 * width
    assert [sum(params[i].numel() for i in plan.params) for plan in plans[2:]] == [block, block]


def test_default_units_join_three_blocks_of_the_369m_model() -> None:
    """Width 1024, 24 blocks of 12.6M: 8 units of 3 blocks, 12 units in all (the units module's
    example), which made stage 3 faster on GPUs (benchmarks/RESULTS.md)."""
    zero = load_config({"train_micro_batch_size_per_gpu": 1}).zero_optimization
    with torch.device("meta"):
        model = _Gpt(width=1024, blocks=24)
    params = list(model.parameters())
    plans = plan_units(
        model, params, zero.stage3_max_unit_numel, zero.stage3_min_unit_numel, zero.stage3_coalesce_numel
    )
    names = [plan.name for plan in plans]
    assert names == ["", "tok", "pos", *(f"blocks.{i}-{i + 2}" for i in range(0, 24, 3)), "head"]


class _Gpt(nn.Module):
    """shared/anchors/zero_anchor.py's GPT, parameters only."""

    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(32000, width), nn.Embedding(1024, width)
        self.blocks = nn.ModuleList(_Block(width) for _ in range(blocks))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, 32000, bias=False)


# --- loss scaler -----------------------------------------------------------------------------


def test_dynamic_loss_scale_follows_the_docstring_example() -> None:
    from commlayer.zero.config import FP16Config

    scaler = LossScaler.from_config(FP16Config(enabled=True))
    assert scaler.scale == 65536.0
    scaler = scaler.update(True)
    assert scaler.scale == 65536.0 and scaler.tolerance_left == 1  # hysteresis absorbs one overflow
    scaler = scaler.update(True)
    assert scaler.scale == 32768.0
    for _ in range(999):
        scaler = scaler.update(False)
    assert scaler.scale == 32768.0
    scaler = scaler.update(False)
    assert scaler.scale == 65536.0 and scaler.tolerance_left == 2
    floor = LossScaler.from_config(
        FP16Config(enabled=True, initial_scale_power=1, hysteresis=1, min_loss_scale=1.0)
    )
    assert floor.update(True).update(True).scale == 1.0
    assert LossScaler.from_config(FP16Config(enabled=True, loss_scale=128.0)).update(True).scale == 128.0
    assert LossScaler.from_config(FP16Config()).scale == 1.0
