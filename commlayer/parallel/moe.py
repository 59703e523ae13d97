"""Expert-parallel mixture of experts over ``mesh["ep"]``, on ``commlayer.dist`` only.

``MoE(hidden, expert, num_experts, mesh)`` keeps ``num_experts / ep`` copies of ``expert`` on each
rank (rank ``r`` of the "ep" group owns experts ``r * E_local ... (r + 1) * E_local - 1``). A
forward pass routes every token (:mod:`.gating`), packs the kept choices into an
``[experts, capacity, hidden]`` buffer, all-to-alls it over "ep" so that each rank receives the
tokens of its own experts from every rank, runs its experts, all-to-alls the results back and
combines them with the gate weights. Backward runs the same exchanges in reverse.

Packing and combining are row gathers whose gradients are gathers too (:mod:`.routes`): no
one-hot ``[tokens, experts, capacity]`` einsum, no atomic adds and no device-to-host sync.

Gradients: expert weights differ across the "ep" group, so they are summed over ``mesh["edp"]``
(the ranks holding the same experts); dense weights (the gate, and everything outside the MoE)
over data parallel. :func:`reduce_gradients` does both for plain training loops;
``commlayer.zero`` does it for its engine (expert parameters are marked, see
:func:`is_expert_parameter`). Every rank of an "ep" group must pass the same number of tokens.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from commlayer import dist
from commlayer.core.errors import invalid_argument
from commlayer.dist import ProcessGroup
from commlayer.mesh import Mesh
from commlayer.parallel.checks import mesh_dim_group, require_divisible
from commlayer.parallel.exchange import exchange
from commlayer.parallel.gating import GateOptions, Routing, capacity_for, route
from commlayer.parallel.routes import RouteMap, combine, dispatch

__all__ = ["MoE", "is_expert_parameter", "reduce_gradients"]

_EXPERT_MARK = "commlayer_expert"
DEFAULT_GATE = GateOptions()


def is_expert_parameter(param: torch.Tensor) -> bool:
    """Whether ``param`` belongs to an expert of a :class:`MoE` (reduced over "edp", not "dp")."""
    return bool(getattr(param, _EXPERT_MARK, False))


class MoE(nn.Module):
    """A mixture-of-experts layer with top-k gating and expert parallelism.

    Args:
        hidden_size: the last dim of the input.
        expert: the module copied into each local expert (``hidden -> hidden``).
        num_experts: experts in the whole layer; divisible by the "ep" size.
        mesh: a device mesh with a "dp" dim built with ``expert_parallel_size``; None runs every
            expert locally (single process, or no expert parallelism).
        options: routing (``k``, capacity factors, dropping policy), see :class:`GateOptions`.

    ``forward(x)`` returns ``(output, aux_loss, load)`` like DeepSpeed's ``MoE``: the output in
    the input's shape, the load-balancing loss, and the choices routed to each expert.
    """

    def __init__(
        self,
        hidden_size: int,
        expert: nn.Module,
        num_experts: int,
        mesh: Mesh | None = None,
        *,
        options: GateOptions = DEFAULT_GATE,
    ) -> None:
        super().__init__()
        rank = dist.get_rank() if dist.is_initialized() else 0
        self.group: ProcessGroup | None = None if mesh is None else mesh_dim_group("MoE", mesh, "ep", rank)
        ep = 1 if self.group is None else self.group.size()
        _check_options(num_experts, ep, options, rank)
        self.options, self.num_experts, self.hidden_size = options, num_experts, hidden_size
        self.num_local_experts = num_experts // ep
        self.first_expert = (0 if self.group is None else self.group.rank()) * self.num_local_experts
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(copy.deepcopy(expert) for _ in range(self.num_local_experts))
        for param in self.experts.parameters():
            setattr(param, _EXPERT_MARK, True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if x.shape[-1] != self.hidden_size:
            raise invalid_argument(
                "MoE.forward",
                "x",
                f"a last dim of {self.hidden_size}",
                tuple(x.shape),
                dist.get_rank() if dist.is_initialized() else None,
            )
        tokens = x.reshape(-1, self.hidden_size)
        routing = self.route(tokens)
        out = self._dispatch_and_combine(_autocast(tokens), routing)
        return out.view(*x.shape[:-1], out.shape[-1]), routing.aux_loss, routing.load

    def route(self, tokens: torch.Tensor) -> Routing:
        """The routing of ``[tokens, hidden]`` (the gate runs in fp32, outside autocast)."""
        with torch.autocast(device_type=tokens.device.type, enabled=False):
            logits = F.linear(tokens.float(), self.gate.weight.float())
        if self.options.drop_tokens:
            capacity = capacity_for(tokens.shape[0], self.num_experts, self.options, self.training)
            return route(logits, self.options, capacity)
        unlimited = route(logits, self.options, tokens.shape[0] * self.options.k)
        fullest = unlimited.load.max().reshape(1)
        if self.group is not None:
            dist.all_reduce(fullest, op=dist.ReduceOp.MAX, group=self.group)
        return route(logits, self.options, int(fullest.item()))

    def _dispatch_and_combine(self, tokens: torch.Tensor, routing: Routing) -> torch.Tensor:
        experts, capacity, width = self.num_experts, routing.capacity, tokens.shape[1]
        routes = RouteMap.build(routing.expert, routing.slot, capacity, experts)
        received = self._exchange(dispatch(tokens, routes).view(experts, capacity, width))
        results = self._run_experts(received.view(-1, self.num_local_experts, capacity, width))
        returned = self._exchange(results.reshape(experts, capacity, -1))
        return combine(returned.view(experts * capacity, -1), routing.weight, routes)

    def _exchange(self, buffer: torch.Tensor) -> torch.Tensor:
        return buffer if self.group is None else exchange(self.group, (buffer,), 0, 0)[0]

    def _run_experts(self, received: torch.Tensor) -> torch.Tensor:
        """``received[p, i]``: the tokens rank ``p`` sent to local expert ``i``; same layout back."""
        sources, _, capacity, width = received.shape
        # Expert-major once, so each expert reads one contiguous block (and its gradient is one
        # stack, not a zero-filled full-size tensor per expert summed up).
        per_expert = received.transpose(0, 1).reshape(self.num_local_experts, sources * capacity, width)
        outputs = [expert(rows) for rows, expert in zip(per_expert.unbind(0), self.experts)]
        return torch.stack(outputs).view(self.num_local_experts, sources, capacity, -1).transpose(0, 1)


def _autocast(tokens: torch.Tensor) -> torch.Tensor:
    """Tokens in the autocast dtype when autocast is on: the experts would cast them anyway, and
    the exchanges then move half the bytes."""
    device = tokens.device.type
    if torch.is_autocast_enabled(device):
        return tokens.to(torch.get_autocast_dtype(device))
    return tokens


def _check_options(num_experts: int, ep: int, options: GateOptions, rank: int) -> None:
    if not isinstance(num_experts, int) or num_experts < 1:
        raise invalid_argument("MoE", "num_experts", "a positive int", num_experts, rank)
    require_divisible("MoE", "num_experts", num_experts, ep, "the ep size", rank)
    if not 1 <= options.k <= num_experts:
        raise invalid_argument(
            "MoE", "options.k", f"an int in [1, num_experts={num_experts}]", options.k, rank
        )
    if options.drop_policy not in ("position", "probs"):
        raise invalid_argument(
            "MoE", "options.drop_policy", "'position' or 'probs'", repr(options.drop_policy), rank
        )
    if options.capacity_factor <= 0 or options.eval_capacity_factor <= 0 or options.min_capacity < 0:
        received = (options.capacity_factor, options.eval_capacity_factor, options.min_capacity)
        raise invalid_argument(
            "MoE", "options", "positive capacity factors and min_capacity >= 0", received, rank
        )


def reduce_gradients(module: nn.Module, mesh: Mesh, dense_dims: tuple[str, ...] = ("dp",)) -> None:
    """Average ``module``'s gradients for a plain (non-ZeRO) loop: dense ones over ``dense_dims``,
    expert ones summed over "edp" and divided by the data-parallel size (each expert saw the
    tokens of its whole "ep" group, so this is the average over every data-parallel rank)."""
    params = [p for p in module.parameters() if p.grad is not None]
    dense = [p.grad for p in params if not is_expert_parameter(p)]
    expert = [p.grad for p in params if is_expert_parameter(p)]
    _average(dense, mesh[dense_dims].group, mesh[dense_dims].size())
    _average(expert, mesh["edp"].group, mesh.size("dp"))


def _average(grads: list[torch.Tensor], group: ProcessGroup, divisor: int) -> None:
    """Sum ``grads`` over ``group`` (one flat collective) and divide them by ``divisor``."""
    if not grads:
        return
    if group.size() == 1:  # nothing to sum: scale in place, without a flat copy
        if divisor != 1:
            torch._foreach_div_(grads, divisor)
        return
    flat = torch.cat([g.reshape(-1) for g in grads]).div_(divisor)
    dist.all_reduce(flat, group=group)
    torch._foreach_copy_(
        grads, [piece.view_as(g) for piece, g in zip(flat.split([g.numel() for g in grads]), grads)]
    )
