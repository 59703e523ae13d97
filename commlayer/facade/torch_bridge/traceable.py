"""What torch.compile traces in place of commlayer.dist's collectives: torch's functional collectives.

The facade's eager path (validation tables, backend objects, MPI requests) is not traceable, and
Dynamo cannot hash commlayer's ReduceOp. So each collective below is registered with Dynamo
(``substitute_in_graph``) as the traceable form of the facade function of the same name: under
compilation ``dist.all_reduce(t)`` becomes ``t.copy_(funcol.all_reduce(t, "sum", pg))`` on the
group's torch ProcessGroup, which for mpi, ccl and plugin groups is the commlayer bridge; the
compiled graph therefore runs on the group's own backend. Eager calls never see any of this.

Registration needs ``torch._dynamo``, which costs ~1.7 s to import, so it happens when something
else imports Dynamo (``torch.compile`` does): an import hook runs :func:`on_dynamo_loaded` then.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed._functional_collectives as funcol

from commlayer.core.errors import UnsupportedError
from commlayer.core.types import ReduceOp
from commlayer.facade.groups import group as groups
from commlayer.facade.ops import in_place as planned
from commlayer.facade.ops import into_tensor as paired
from commlayer.facade.ops import tensor_lists as coll

__all__ = ["install"]

log = logging.getLogger("commlayer.dist")


def all_reduce(
    tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> None:
    _synchronous("all_reduce", async_op)
    tensor.copy_(funcol.all_reduce(tensor, _op_name(op), _torch_group(group)))


def all_gather_into_tensor(
    output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None, async_op: bool = False
) -> None:
    _synchronous("all_gather_into_tensor", async_op)
    gathered = funcol.all_gather_tensor(input_tensor.reshape(-1), 0, _torch_group(group))
    output_tensor.copy_(gathered.view(output_tensor.shape))


def reduce_scatter_tensor(
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> None:
    _synchronous("reduce_scatter_tensor", async_op)
    reduced = funcol.reduce_scatter_tensor(input.reshape(-1), _op_name(op), 0, _torch_group(group))
    output.copy_(reduced.view(output.shape))


def all_gather(
    tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False
) -> None:
    _synchronous("all_gather", async_op)
    gathered = funcol.all_gather_tensor(tensor.reshape(-1), 0, _torch_group(group))
    for output, chunk in zip(tensor_list, gathered.chunk(len(tensor_list))):
        output.copy_(chunk.view(output.shape))


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> None:
    _synchronous("all_to_all_single", async_op)
    exchanged = funcol.all_to_all_single(
        input,
        None if output_split_sizes is None else list(output_split_sizes),
        None if input_split_sizes is None else list(input_split_sizes),
        _torch_group(group),
    )
    output.copy_(exchanged)


def broadcast(
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> None:
    _synchronous("broadcast", async_op)
    resolved = _resolve(group)
    root = group_src if group_src is not None else resolved.ranks.index(0 if src is None else src)
    tensor.copy_(funcol.broadcast(tensor, root, _torch_group(group)))


_TRACEABLE_FORMS: tuple[tuple[Callable[..., Any], Callable[..., Any]], ...] = (
    (planned.all_reduce, all_reduce),
    (paired.all_gather_into_tensor, all_gather_into_tensor),
    (paired.reduce_scatter_tensor, reduce_scatter_tensor),
    (coll.all_gather, all_gather),
    (paired.all_to_all_single, all_to_all_single),
    (planned.broadcast, broadcast),
)


def _resolve(group: Any) -> groups.ProcessGroup:
    return groups.current_world("torch.compile").default_group if group is None else group


def _torch_group(group: Any) -> Any:
    """The group's torch ProcessGroup; prepared eagerly (see on_dynamo_loaded) so tracing reads it."""
    resolved = _resolve(group)
    return resolved.bridge if resolved.bridge is not None else resolved.torch_group


def _op_name(op: Any) -> str:
    # Read the member's value: Dynamo cannot hash ReduceOp, but reads an enum's value fine.
    return op.value if isinstance(op, ReduceOp) else str(op.name).lower()


def _synchronous(op: str, async_op: bool) -> None:
    if async_op:
        raise UnsupportedError(
            f"{op}: argument 'async_op' expected False under torch.compile (compiled collectives are "
            "synchronous functional collectives), received True"
        )


# --- registration ---------------------------------------------------------------------------


def on_dynamo_loaded() -> None:
    """Register the traceable forms and give every existing group its torch ProcessGroup."""
    from torch._dynamo.decorators import substitute_in_graph

    for original, traceable in _TRACEABLE_FORMS:
        substitute_in_graph(original, skip_signature_check=True)(traceable)
    world = groups.world_or_none()
    if world is not None:
        for group in (world.default_group, *world.groups.values()):
            group.torch_group  # noqa: B018 - built now: tracing must not build it


def dynamo_loaded() -> bool:
    """Whether torch.compile may trace commlayer calls in this process (Dynamo is imported)."""
    return "torch._dynamo" in sys.modules


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Runs on_dynamo_loaded right after ``torch._dynamo`` finishes importing, then steps aside."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run_module(module)
            _run_registration()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_installed = False


def install() -> None:
    """Register now if Dynamo is already imported, else when it is (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    if "torch._dynamo" in sys.modules:
        _run_registration()
    else:
        sys.meta_path.insert(0, _AfterDynamoImport())


def _run_registration() -> None:
    try:
        on_dynamo_loaded()
    except Exception as error:  # noqa: BLE001 - never break the import of torch._dynamo
        log.warning("commlayer: collectives will not be traceable by torch.compile: %s", error)
