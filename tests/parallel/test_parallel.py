"""Ulysses sequence parallelism and expert-parallel MoE: routing logic, wiring, real worlds.

Tier 1 checks the router against a plain Python re-statement of its rules; tier 2 runs the
layers in a world of one; tier 3 spawns gloo worlds of 4 and 2 and an mpirun world of 2, each
running every equivalence check of tests/parallel/parallel_ranks.py.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from commlayer.core.errors import InvalidArgumentError
from commlayer.mesh import init_mesh
from commlayer.parallel import GateOptions, MoE, UlyssesAttention, capacity_for, route, shard_sequence
from commlayer.parallel.routes import RouteMap, combine, dispatch
from commlayer.testing import require_mpirun, run_world

REPO = Path(__file__).resolve().parents[2]


def naive_slots(
    experts: list[list[int]], probs: list[list[float]], capacity: int, policy: str
) -> list[list[int]]:
    """The dropping rules written out: who gets which slot of each expert, -1 when full."""
    tokens, k = len(experts), len(experts[0])
    choices = [(choice, token) for choice in range(k) for token in range(tokens)]
    if policy == "probs":
        choices.sort(key=lambda pair: -probs[pair[1]][pair[0]])
    filled: dict[int, int] = {}
    slots = [[-1] * k for _ in range(tokens)]
    for choice, token in choices:
        expert = experts[token][choice]
        position = filled.get(expert, 0)
        filled[expert] = position + 1
        slots[token][choice] = position if position < capacity else -1
    return slots


@pytest.mark.parametrize("policy", ["position", "probs"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_routing_follows_the_dropping_rules(policy: str, k: int) -> None:
    generator = torch.Generator().manual_seed(k)
    logits = torch.randn(40, 5, generator=generator) + torch.tensor([1.5, 0, 0, 0, -1])
    options = GateOptions(k=k, capacity_factor=0.8, min_capacity=1, drop_policy=policy)  # type: ignore[arg-type]
    capacity = capacity_for(40, 5, options, training=True)
    assert capacity == max(1, math.ceil(k * 40 * 0.8 / 5))
    routing = route(logits, options, capacity)
    probs = torch.softmax(logits, -1).topk(k, -1)
    assert routing.slot.tolist() == naive_slots(
        probs.indices.tolist(), probs.values.tolist(), capacity, policy
    )
    assert not bool(routing.kept.all()) and bool((routing.weight[~routing.kept] == 0).all())
    kept_weights = routing.weight.sum(-1)[routing.kept.any(-1)]
    if k > 1:  # normalised over the kept choices
        assert torch.allclose(kept_weights, torch.ones_like(kept_weights))
    assert routing.load.tolist() == torch.bincount(probs.indices.reshape(-1), minlength=5).tolist()
    first = torch.nn.functional.one_hot(probs.indices[:, 0], 5).float().mean(0)
    assert torch.allclose(routing.aux_loss, 5 * (torch.softmax(logits, -1).mean(0) * first).sum())


def test_dispatch_and_combine_equal_a_loop_over_choices_and_their_gradients_check() -> None:
    logits = torch.randn(16, 4, generator=torch.Generator().manual_seed(3))
    routing = route(logits, GateOptions(k=2, min_capacity=1), capacity=5)
    assert not bool(routing.kept.all())  # some choices dropped, some slots empty
    routes = RouteMap.build(routing.expert, routing.slot, 5, 4)
    tokens = torch.randn(16, 3, dtype=torch.double, requires_grad=True)
    weight = routing.weight.double().requires_grad_()
    slots = dispatch(tokens, routes)
    expected_slots = torch.zeros(20, 3, dtype=torch.double)
    expected_out = torch.zeros(16, 3, dtype=torch.double)
    for token, choice in zip(*torch.nonzero(routing.kept, as_tuple=True)):
        slot = int(routing.expert[token, choice]) * 5 + int(routing.slot[token, choice])
        expected_slots[slot] = tokens[token]
        expected_out[token] += weight[token, choice] * (tokens[token] * 2 + 1)
    assert torch.equal(slots, expected_slots)
    assert torch.allclose(combine(slots * 2 + 1, weight, routes), expected_out)
    assert torch.autograd.gradcheck(
        lambda x, w: combine(dispatch(x, routes) * 2 + 1, w, routes), (tokens, weight)
    )


def test_layers_in_a_world_of_one_equal_plain_computation(world_of_one: None) -> None:
    mesh = init_mesh((1, 1), ("dp", "sp"))
    q = torch.randn(2, 6, 4, 3)
    attention = UlyssesAttention(lambda q, k, v: q * 2 + k * v, mesh)
    assert torch.equal(attention(q, q + 1, q), q * 2 + (q + 1) * q)
    assert torch.equal(shard_sequence(q, mesh), q)
    layer = MoE(8, nn.Linear(8, 8), 4, init_mesh((1,), ("dp",)), options=GateOptions(k=2))
    out, aux, load = layer(torch.randn(3, 5, 8))
    assert out.shape == (3, 5, 8) and aux.dim() == 0 and int(load.sum()) == 30


def test_a_layer_on_a_mesh_without_its_dim_names_the_dim(world_of_one: None) -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"UlyssesAttention: argument ''sp' dim of mesh' expected a dim"
    ):
        UlyssesAttention(lambda q, k, v: q, init_mesh((1,), ("dp",)))
    with pytest.raises(InvalidArgumentError, match=r"UlyssesAttention: argument 'head_dim'"):
        UlyssesAttention(lambda q, k, v: q, init_mesh((1, 1), ("dp", "sp")), seq_dim=2, head_dim=2)


@pytest.mark.multirank
@pytest.mark.parametrize("world_size", [4, 2])
def test_ulysses_and_moe_equal_single_process_on_gloo(world_size: int) -> None:
    run_world("tests.parallel.parallel_ranks:main", world_size=world_size, backend="gloo", timeout=300)


@pytest.mark.multirank
@pytest.mark.slow
def test_the_gpt_example_trains_with_sp_ep_and_hybrid_sharding_under_commlayer_run() -> None:
    command = [str(Path(sys.executable).with_name("commlayer")), "run", "-n", "4"]
    command += [str(REPO / "examples" / "gpt_parallel.py"), "--steps", "3"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for kind in ("sp", "ep", "hybrid"):
        assert f"{kind}: loss " in done.stdout, done.stdout[-3000:]


@pytest.mark.multirank
@pytest.mark.mpi
def test_ulysses_and_moe_equal_single_process_on_mpi() -> None:
    require_mpirun()
    run_world(
        "tests.parallel.parallel_ranks:main", world_size=2, backend="mpi", launcher="mpirun", timeout=300
    )
