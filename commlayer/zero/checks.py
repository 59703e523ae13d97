"""Checks of the model and optimizer handed to ``initialize``, all before any communication."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from commlayer.core.errors import InvalidArgumentError
from commlayer.zero.config import ZeroConfig

__all__ = ["ELEMENTWISE_OPTIMIZERS", "check_model_and_optimizer", "named_parameters"]

#: torch optimizers whose update of an element depends only on that element's own history, so
#: stepping a shard equals stepping the whole tensor and slicing. Others need
#: ``zero_allow_untested_optimizer`` from stage 1 on (e.g. LAMB's per-tensor trust ratio).
ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = tuple(
    getattr(torch.optim, name)
    for name in (
        "SGD",
        "Adam",
        "AdamW",
        "Adagrad",
        "Adadelta",
        "Adamax",
        "ASGD",
        "NAdam",
        "RAdam",
        "RMSprop",
        "Rprop",
    )
    if hasattr(torch.optim, name)
)


def named_parameters(model: torch.nn.Module) -> tuple[list[str], list[torch.nn.Parameter]]:
    """Each distinct parameter once (the first name it is reachable by), in registration order."""
    names, params = [], []
    for name, param in model.named_parameters():
        names.append(name)
        params.append(param)
    return names, params


def check_model_and_optimizer(
    model: object, optimizer: object, config: ZeroConfig, rank: int
) -> tuple[list[str], list[torch.nn.Parameter]]:
    """Validate and return the model's named parameters; every error names what to fix."""
    if not isinstance(model, torch.nn.Module):
        raise _error("model", "a torch.nn.Module", type(model).__name__, rank)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise _error(
            "optimizer", "a torch.optim.Optimizer built on model.parameters()", type(optimizer).__name__, rank
        )
    names, params = named_parameters(model)
    if not params:
        raise _error("model", "a module with parameters", "a module with none", rank)
    _check_tensors(names, params, rank)
    _check_membership(names, params, optimizer, rank)
    if optimizer.state:
        raise _error(
            "optimizer",
            "a fresh optimizer with no state (create the engine before any optimizer.step())",
            f"an optimizer with state for {len(optimizer.state)} tensors",
            rank,
        )
    if (
        config.stage >= 1
        and not isinstance(optimizer, ELEMENTWISE_OPTIMIZERS)
        and not config.zero_allow_untested_optimizer
    ):
        known = ", ".join(cls.__name__ for cls in ELEMENTWISE_OPTIMIZERS)
        raise _error(
            "optimizer",
            f"an element-wise optimizer for ZeRO stage {config.stage} ({known}), or "
            "'zero_allow_untested_optimizer': true in the config",
            type(optimizer).__name__,
            rank,
        )
    return names, params


def _check_tensors(names: Sequence[str], params: Sequence[torch.nn.Parameter], rank: int) -> None:
    devices = {p.device for p in params}
    if len(devices) > 1:
        raise _error(
            "model", "every parameter on one device", f"parameters on {sorted(map(str, devices))}", rank
        )
    for name, param in zip(names, params):
        if not param.dtype.is_floating_point:
            raise _error(
                "model", "floating-point parameters", f"parameter '{name}' of dtype {param.dtype}", rank
            )


def _check_membership(
    names: Sequence[str], params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer, rank: int
) -> None:
    index_of = {id(p): i for i, p in enumerate(params)}
    in_optimizer: set[int] = set()
    for group_index, group in enumerate(optimizer.param_groups):
        for position, tensor in enumerate(group["params"]):
            if id(tensor) not in index_of:
                shape = tuple(getattr(tensor, "shape", ()))
                raise _error(
                    "optimizer",
                    "only parameters of the model",
                    f"param_groups[{group_index}]['params'][{position}] "
                    f"(shape {shape}), which is not a parameter of the model",
                    rank,
                )
            in_optimizer.add(id(tensor))
    missing = [name for name, p in zip(names, params) if p.requires_grad and id(p) not in in_optimizer]
    if missing:
        raise _error(
            "optimizer",
            "every trainable model parameter in some param group (freeze the others with "
            "requires_grad_(False))",
            f"an optimizer without {_first(missing)}",
            rank,
        )


def _first(items: Sequence[str], shown: int = 5) -> str:
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(f"'{item}'" for item in items[:shown]) + more


def _error(arg: str, expected: str, received: str, rank: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"initialize: argument '{arg}' expected {expected}, received {received} (rank {rank})"
    )
