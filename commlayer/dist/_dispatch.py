"""The one path every facade op takes: resolve the group, pick the backend, stage, launch, wait.

Ops on a rank outside the group return None without communicating (torch's NON_GROUP_MEMBER
behaviour). Non-contiguous tensors are copied to contiguous buffers and copied back when the work
completes, because some libraries (torch 2.13's gloo among them) silently mis-handle strided
memory; backends therefore only ever see contiguous tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from ..backend import Backend
from ..errors import UnsupportedError, invalid_argument
from ..work import Work
from ._groups import ProcessGroup, resolve_group

__all__ = ["OpCall", "Observer", "begin", "contiguous", "device_type", "launch", "set_observer"]

log = logging.getLogger("commlayer.dist")


class OpCall(NamedTuple):
    """One facade call after its group and backend are resolved (a tuple: cheap to build)."""

    op: str
    group: ProcessGroup
    backend: Backend

    @property
    def rank(self) -> int:
        """Global rank, for error messages."""
        return self.group.global_rank


class Observer(Protocol):
    """The comms logger's hook: wraps ``start`` (which launches the op) to time it."""

    def observe(self, call: OpCall, nbytes: int, start: Callable[[], Work]) -> Work: ...


_observer: Observer | None = None

_SYNC_HINT = {"async_op": False}
_NO_HINT: dict[str, bool] = {}

# Facade ops that are not backend ops, and the backend ops they are built from.
_BUILT_FROM = {"monitored_barrier": ("send", "recv")}


# torch.device.type builds a new str on every access (about 160 ns, as much as a whole tensor
# check); devices hash in about 20 ns, so each distinct device's type is computed once.
_device_types: dict[torch.device, str] = {}


def device_type(device: torch.device) -> str:
    """``device.type``, memoised."""
    kind = _device_types.get(device)
    if kind is None:
        kind = _device_types[device] = device.type
    return kind


def set_observer(observer: Observer | None) -> None:
    global _observer
    _observer = observer


def begin(op: str, group_arg: Any, device: torch.device | None = None) -> OpCall | None:
    """The op's group and backend, checked once per (op, device) and group, then reused."""
    group = resolve_group(op, group_arg)
    if group is None:
        log.debug("%s: this rank is not a member of %r; doing nothing", op, group_arg)
        return None
    key = (op, device)
    call = group.op_calls.get(key)
    if call is None:
        call = group.op_calls[key] = _new_call(op, group, device)
    return call


def _new_call(op: str, group: ProcessGroup, device: torch.device | None) -> OpCall:
    backend = group.primary_backend if device is None else group.backend_for(device_type(device))
    if backend is None:
        raise invalid_argument(
            op,
            "tensor",
            f"a tensor on {' or '.join(group.device_types)} (backend '{group.backend_spec}')",
            f"a tensor on {device}",
            group.global_rank,
            UnsupportedError,
        )
    ops = backend.capabilities.ops
    if op not in ops and not (op in _BUILT_FROM and all(needed in ops for needed in _BUILT_FROM[op])):
        raise UnsupportedError(
            f"{op}: backend '{backend.name}' does not support this op (rank {group.global_rank})"
        )
    return OpCall(op, group, backend)


def contiguous(tensor: torch.Tensor, copy_back: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """A contiguous stand-in for ``tensor``; outputs register a copy back into the original."""
    if tensor.is_contiguous():
        return tensor
    buffer = tensor.contiguous()
    copy_back.append((tensor, buffer))
    return buffer


def launch(
    call: OpCall,
    start: Callable[[Backend, Mapping[str, bool]], Work],
    *,
    async_op: bool,
    payload: torch.Tensor | Sequence[torch.Tensor] = (),
    copy_back: Sequence[tuple[torch.Tensor, torch.Tensor]] = (),
) -> Work | None:
    """Run ``start`` on the call's backend; wait unless ``async_op``, as torch does.

    A synchronous op waits with no explicit timeout, exactly like torch: on CUDA that only orders
    the current stream after the collective instead of blocking the CPU (a timed wait makes
    torch's NCCL work poll the CPU at 1 ms intervals), and every Work adapter bounds an untimed
    wait by its group's timeout itself (torch's own timeout, MPI and oneCCL adapters' deadline).

    ``payload`` is the buffer whose size is the op's message size in nccl-tests' terms (the full
    gathered output, the full reduce-scatter input); it is only measured when the comms logger
    observes the call, so the common path pays nothing for it.
    """
    backend = call.backend
    hint = _SYNC_HINT if not async_op and backend.capabilities.sync_hint else _NO_HINT
    if _observer is None:
        work = start(backend, hint)
    else:
        work = _observer.observe(call, _nbytes(payload), lambda: start(backend, hint))
    if copy_back:
        work = work.then(lambda: [original.copy_(buffer) for original, buffer in copy_back])
    if async_op:
        return work
    work.wait()
    return None


def _nbytes(payload: torch.Tensor | Sequence[torch.Tensor]) -> int:
    tensors = [payload] if isinstance(payload, torch.Tensor) else payload
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
