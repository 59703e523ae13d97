"""Ulysses and MoE checks, many per spawned world (CI has 2 cores: one spawn, many checks).

``run_world("tests.parallel.parallel_ranks:main", 4)`` (also at 2, and under mpirun): every check
compares the distributed layer with the same computation in one process, on tensors whose every
element differs per rank and position.

- Ulysses: forward and backward of causal attention, for each mesh shape the world allows,
  equal full-sequence attention within 1e-5 (non-contiguous inputs, fewer key/value heads);
- Ulysses under ZeRO over ("dp", "sp"): training equals single-process training within 1e-5;
- MoE: outputs, load-balancing loss and loads equal a single-process MoE holding every expert;
  expert gradients equal the sum of the reference gradients of the ep group's tokens, and
  ``reduce_gradients`` gives the data-parallel average (experts over "edp", dense over "dp");
- MoE under ZeRO stages 0-2 (experts sharded over "edp", dense weights over "dp"): training
  equals one process running every rank's micro-batch through a model holding every expert;
- bad shapes raise InvalidArgumentError naming the argument, before any communication.
"""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from commlayer import dist, zero
from commlayer.core.errors import InvalidArgumentError
from commlayer.mesh import Mesh, init_mesh
from commlayer.parallel import GateOptions, MoE, UlyssesAttention, reduce_gradients, shard_sequence
from commlayer.zero import ZeroConfigError

from . import gpt_model as common

TOLERANCE = 1e-5


def log(message: str) -> None:
    if dist.get_rank() == 0:
        print(message, file=sys.stderr, flush=True)


def close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    difference = (actual - expected).abs().max().item()
    assert difference <= TOLERANCE, (
        f"{what}: differs by {difference:.3g} (> {TOLERANCE}) on rank {dist.get_rank()}"
    )


def main() -> None:
    torch.set_num_threads(1)  # ranks share 2 cores
    world = dist.get_world_size()
    check_bad_shapes_fail_before_communicating(world)
    for shape in ((1, world), (world // 2, 2)) if world >= 4 else ((1, world),):
        mesh = init_mesh(shape, ("dp", "sp"))
        check_ulysses_attention(mesh)
        check_ulysses_training_under_zero(mesh, stage=3 if shape[0] > 1 else 1)
    for ep in sorted({2, world}):
        mesh = init_mesh((world,), ("dp",), expert_parallel_size=ep)
        for options in (
            GateOptions(k=2, capacity_factor=1.0, min_capacity=1),
            GateOptions(k=1, capacity_factor=0.75, min_capacity=1, drop_policy="probs"),
            GateOptions(k=2, drop_tokens=False),
        ):
            check_moe_layer(mesh, options)
    mesh = init_mesh((world,), ("dp",), expert_parallel_size=2)
    for stage in (0, 1, 2) if world >= 4 else (2,):
        check_moe_training_under_zero(mesh, stage)
    dist.barrier()


# --- Ulysses ---------------------------------------------------------------------------------


def check_ulysses_attention(mesh: Mesh) -> None:
    sp, rank = mesh.size("sp"), dist.get_rank()
    generator = torch.Generator().manual_seed(3)
    batch, seq, heads, kv_heads, dim = 2, 8 * sp, 2 * sp, sp, 4
    # Keys and values with fewer heads (grouped-query shapes) travel in their own exchange.
    q = torch.randn(batch, seq, heads, dim, generator=generator, requires_grad=True)
    k, v = (torch.randn(batch, seq, kv_heads, dim, generator=generator, requires_grad=True) for _ in range(2))
    grad_out = torch.randn(batch, seq, heads, dim, generator=generator)

    def grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        repeat = q.shape[2] // k.shape[2]
        return common.causal_attention(q, k.repeat_interleave(repeat, 2), v.repeat_interleave(repeat, 2))

    expected = grouped(q, k, v)
    (expected * grad_out).sum().backward()
    # A non-contiguous query: the same values laid out heads-first.
    local = [shard_sequence(t.detach(), mesh).clone().requires_grad_() for t in (q, k, v)]
    q_strided = local[0].transpose(1, 2).contiguous().transpose(1, 2)
    out = UlyssesAttention(grouped, mesh)(q_strided, local[1], local[2])
    close(out, shard_sequence(expected.detach(), mesh), f"Ulysses forward sp={sp}")
    (out * shard_sequence(grad_out, mesh)).sum().backward()
    for name, mine, full in zip("qkv", local, (q, k, v)):
        close(mine.grad, shard_sequence(full.grad, mesh), f"Ulysses d{name} sp={sp}")
    log(f"Ulysses attention sp={sp} (mesh {mesh.shape}): forward and backward match, rank {rank}")


def check_ulysses_training_under_zero(mesh: Mesh, stage: int, steps: int = 4) -> None:
    """Ulysses GPT under ZeRO over ("dp", "sp") vs the plain model on the whole batch."""
    dp, sp = mesh.size("dp"), mesh.size("sp")
    sequences = 8
    expected = common.reference_weights(steps, sequences)
    model = common.make_model(mesh=mesh, sequence_parallel=True)
    engine = zero.initialize(
        model=model,
        optimizer=common.make_optimizer(model),
        config={
            "train_micro_batch_size_per_gpu": sequences // dp,
            "gradient_clipping": 0.5,
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 4000, "stage3_max_unit_numel": 6000},
        },
        mesh=mesh,
    )
    share = sequences // dp
    for step in range(steps):
        x, y = global_batch_slice(step, sequences, mesh.get_local_rank("dp"), share)
        engine.backward(engine(shard_sequence(x, mesh), shard_sequence(y, mesh)))
        engine.step()
    difference, key = common.max_difference(engine.full_state_dict(), expected)
    assert difference <= TOLERANCE, (
        f"Ulysses+ZeRO-{stage} dp={dp} sp={sp}: '{key}' differs by {difference:.3g}"
    )
    log(f"Ulysses GPT under ZeRO-{stage}, dp={dp} sp={sp}: weights match ({difference:.3g})")
    engine.destroy()


def global_batch_slice(
    step: int, sequences: int, dp_rank: int, share: int
) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = common.global_batch(step, sequences)
    return x[dp_rank * share : (dp_rank + 1) * share], y[dp_rank * share : (dp_rank + 1) * share]


# --- MoE -------------------------------------------------------------------------------------


def rank_tokens(rank: int, tokens: int = 24) -> torch.Tensor:
    # A skewed gate input (a shared offset) makes some experts overflow, so dropping happens.
    generator = torch.Generator().manual_seed(900 + rank)
    return torch.randn(tokens, common.WIDTH, generator=generator) + 0.5


def moe_pair(mesh: Mesh, options: GateOptions) -> tuple[MoE, MoE]:
    """The distributed layer and a single-process one holding every expert, same weights."""
    torch.manual_seed(11)
    expert = nn.Sequential(nn.Linear(common.WIDTH, 48), nn.GELU(), nn.Linear(48, common.WIDTH))
    reference = MoE(common.WIDTH, expert, common.EXPERTS, None, options=options)
    for index, module in enumerate(reference.experts):  # distinct experts (copies start equal)
        for param in module.parameters():
            param.data.add_(0.01 * index)
    layer = MoE(common.WIDTH, expert, common.EXPERTS, mesh, options=options)
    layer.gate.load_state_dict(reference.gate.state_dict())
    for index, module in enumerate(layer.experts):
        module.load_state_dict(reference.experts[layer.first_expert + index].state_dict())
    return layer, reference


def check_moe_layer(mesh: Mesh, options: GateOptions) -> None:
    rank, ep = dist.get_rank(), mesh.size("ep")
    layer, reference = moe_pair(mesh, options)
    x = rank_tokens(rank).requires_grad_()
    out, aux, load = layer(x)
    (out.pow(2).mean() + aux).backward()
    expected, expected_aux, expected_load = reference(x.detach())
    close(out, expected, f"MoE output ep={ep} {options}")
    close(aux, expected_aux, "MoE aux loss")
    assert torch.equal(load, expected_load), (load, expected_load)
    if options.drop_tokens:
        routing = reference.route(x.detach())
        assert not bool(routing.kept.all()), "the check wants some tokens dropped"
    # Expert gradients: the reference layer run on every token of my ep group.
    reference.zero_grad()
    for member in mesh["ep"].ranks:
        out_m, aux_m, _ = reference(rank_tokens(member))
        (out_m.pow(2).mean() + aux_m).backward()
    for index, module in enumerate(layer.experts):
        for mine, ref in zip(module.parameters(), reference.experts[layer.first_expert + index].parameters()):
            close(mine.grad, ref.grad, f"MoE expert {layer.first_expert + index} gradient")
    check_reduce_gradients(mesh, layer, reference, options)
    log(f"MoE ep={ep} edp={mesh.size('edp')} {options}: outputs, loads and gradients match")


def check_reduce_gradients(mesh: Mesh, layer: MoE, reference: MoE, options: GateOptions) -> None:
    """After reduce_gradients every gradient is the average over all data-parallel ranks."""
    world = dist.get_world_size()
    reference.zero_grad()
    for member in range(world):
        out_m, aux_m, _ = reference(rank_tokens(member))
        ((out_m.pow(2).mean() + aux_m) / world).backward()
    reduce_gradients(layer, mesh)
    close(layer.gate.weight.grad, reference.gate.weight.grad, "MoE gate gradient after reduce_gradients")
    for index, module in enumerate(layer.experts):
        for mine, ref in zip(module.parameters(), reference.experts[layer.first_expert + index].parameters()):
            close(mine.grad, ref.grad, "MoE expert gradient after reduce_gradients")


def check_moe_training_under_zero(mesh: Mesh, stage: int, steps: int = 4) -> None:
    """An MoE GPT under ZeRO (experts over "edp", dense over "dp") vs one process that runs every
    rank's micro-batch through a model holding every expert (so the routing is the same)."""
    rank, world, sequences = dist.get_rank(), dist.get_world_size(), 8
    share = sequences // world
    reference = common.make_model(experts=common.EXPERTS)
    optimizer = common.make_optimizer(reference)
    for step in range(steps):
        for member in range(world):
            (reference(*global_batch_slice(step, sequences, member, share)) / world).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad()
    model = common.make_model(mesh=mesh, experts=common.EXPERTS)
    settings = {"train_micro_batch_size_per_gpu": share, "gradient_clipping": 0.5,
                "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000}}  # fmt: skip
    engine = zero.initialize(model=model, optimizer=common.make_optimizer(model), config=settings, mesh=mesh)
    for step in range(steps):
        engine.backward(engine(*global_batch_slice(step, sequences, rank, share)))
        engine.step()
    first = model.blocks[0].moe.first_expert
    expected = {
        key: value
        for key, value in (
            (_local_expert_key(key, first, common.EXPERTS // mesh.size("ep")), value)
            for key, value in reference.state_dict().items()
        )
        if key is not None
    }
    difference, key = common.max_difference(engine.full_state_dict(), expected)
    assert difference <= TOLERANCE, f"MoE+ZeRO-{stage}: '{key}' differs by {difference:.3g}"
    log(
        f"MoE GPT under ZeRO-{stage}, ep={mesh.size('ep')} edp={mesh.size('edp')}: weights match ({difference:.3g})"
    )
    engine.destroy()


def _local_expert_key(key: str, first: int, local: int) -> str | None:
    """The reference's global expert key as this rank names it, or None if another rank owns it."""
    if ".experts." not in key:
        return key
    head, rest = key.split(".experts.", 1)
    index, tail = rest.split(".", 1)
    if not first <= int(index) < first + local:
        return None
    return f"{head}.experts.{int(index) - first}.{tail}"


# --- bad input -------------------------------------------------------------------------------


def check_bad_shapes_fail_before_communicating(world: int) -> None:
    """Each raises on every rank before any collective: the world is still usable afterwards."""
    mesh = init_mesh((1, world), ("dp", "sp"))
    attention = UlyssesAttention(common.causal_attention, mesh)
    odd_heads = torch.zeros(1, 4, world + 1, 2)
    with pytest.raises(
        InvalidArgumentError, match=r"UlyssesAttention: argument 'query \(heads, dim 2\)'.*divisible"
    ):
        attention(odd_heads, odd_heads, odd_heads)
    with pytest.raises(
        InvalidArgumentError, match=r"shard_sequence: argument 'tensor \(sequence dim 1\)'.*received"
    ):
        shard_sequence(torch.zeros(2, world + 1), mesh)
    with pytest.raises(InvalidArgumentError, match=r"UlyssesAttention: argument ''cp' dim of mesh'"):
        UlyssesAttention(common.causal_attention, mesh, dim="cp")
    experts_mesh = init_mesh((world,), ("dp",), expert_parallel_size=world)
    expert = nn.Linear(common.WIDTH, common.WIDTH)
    with pytest.raises(
        InvalidArgumentError, match=r"MoE: argument 'num_experts' expected a size divisible by the ep size"
    ):
        MoE(common.WIDTH, expert, world + 1, experts_mesh)
    with pytest.raises(InvalidArgumentError, match=r"MoE: argument ''ep' dim of mesh'"):
        MoE(common.WIDTH, expert, world, init_mesh((world,), ("tp",)))
    with pytest.raises(InvalidArgumentError, match=r"MoE: argument 'options.k'"):
        MoE(common.WIDTH, expert, world, experts_mesh, options=GateOptions(k=world + 1))
    model = common.make_model(mesh=experts_mesh, experts=world)
    with pytest.raises(
        ZeroConfigError, match=r"expert-parallel MoE parameters expected zero_optimization.stage <= 2"
    ):
        settings = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
        zero.initialize(
            model=model, optimizer=common.make_optimizer(model), config=settings, mesh=experts_mesh
        )
    total = torch.ones(1)
    dist.all_reduce(total)
    assert total.item() == world
    log("bad shapes: every error raised before communicating")
