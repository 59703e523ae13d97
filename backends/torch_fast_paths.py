"""Fast paths for the torch backends' hot ops (see ``Backend.recorded_plan``).

Each fast path calls the ProcessGroup's bound method with options built once, exactly as torch's
own Python wrapper would after its checks, which the facade has already made when it built the
plan, and enters the call in the group's flight recorder itself (``flight_recorder.Recording``).
Profiled on a stand-in ProcessGroup (``benchmarks/overhead/torch_vs_commlayer.py --standin``), this
leaves one Python frame between the facade op and the C++ call, where torch's wrapper has its
decorator, its checks and its option building; a separate recording wrapper would double that.
The entry's few lines are therefore written out in each fast path rather than called.

Where the C extension ``commlayer.backends._torch_fast_paths`` is built (setup.py builds it), the
five hottest fast paths (all_reduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor,
send/recv) are its ``FastPath`` objects instead: the same steps with no Python frame, an async
op's Work a C object waited on in C (``FastPathWork``, a virtual subclass of Work). The Python
fast paths below stay the reference and the fallback (``COMMLAYER_C_FAST_PATHS=0`` selects them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.contract.fast_paths import C_FAST_PATHS_ENV, FastPath, c_fast_paths_enabled
from commlayer.core.flight_recorder import Recording
from commlayer.core.types import ReduceOp
from commlayer.core.work import CompletedWork, TorchWork, Work, _raise_typed

try:
    from commlayer.backends import _torch_fast_paths as native
except ImportError:  # a checkout laid out without building (the GPU scripts' site): Python fast paths
    native = None
else:  # the fast paths read tensors through the C reader, where one fits this torch
    from commlayer.core.tensor_reader import tensor_meta_reader

    native.set_tensor_meta(tensor_meta_reader())

__all__ = [
    "C_FAST_PATHS_ENV",
    "FastPathWork",
    "fused_plan",
    "native_enabled",
    "options",
    "wrap",
]


TORCH_OPS = {op: getattr(torch_dist.ReduceOp, op.name) for op in ReduceOp}


def options(kind: Any, async_op: bool, **fields: Any) -> Any:
    """A torch options object; never mutated once built, so one instance serves every call."""
    built = kind()
    for name, value in fields.items():
        setattr(built, name, value)
    if hasattr(built, "asyncOp"):  # torch >= 2.8: a blocking op may run on the caller's stream
        built.asyncOp = async_op
    return built


if native is not None:  # the C fast paths' Work: a virtual commlayer Work, TorchWork for the rest
    FastPathWork: type = native.work_support(TorchWork, _raise_typed)
    Work.register(FastPathWork)
else:
    FastPathWork = TorchWork


def native_enabled() -> bool:
    """Whether new plans get the C fast paths: built, and not turned off by ``$COMMLAYER_C_FAST_PATHS=0``."""
    return native is not None and c_fast_paths_enabled()


def _c_fast_path(
    recording: Recording,
    shape: int,
    method: Callable[..., Any],
    options_pair: tuple[Any, Any],
    peer_tag: tuple[int, int] = (-1, 0),
    payload: int = 0,
) -> FastPath | None:
    """The C fast path of ``shape`` (0: ``method([t], options)``, 1: ``method(out, in, options)``
    on 1-D views, 2: ``method([t], peer, tag)``), or None where the Python one must serve."""
    if not native_enabled():
        return None
    return native.FastPath(shape, method, *options_pair, *peer_tag, payload, recording, FastPathWork)


def wrap(torch_work: Any, results: tuple[torch.Tensor, ...]) -> Work:
    return CompletedWork(results) if torch_work is None else TorchWork(torch_work, results)


def fused_plan(process_group: Any, op: str, fixed: tuple[Any, ...], recording: Recording) -> FastPath | None:
    """The recording fast path of ``op`` on ``process_group`` with trailing arguments ``fixed``."""
    build = _BUILDERS.get(op)
    return None if build is None else build(recording, process_group, *fixed)


# Every Python fast path below is ``Recording.fast_path`` (the flight recorder's entry, the Work
# tracked or the blocking op marked completed, a library error translated) around one
# ProcessGroup call: ``start(async_op, *tensors)`` returns the async op's Work, or the torch Work
# a blocking op waits for (NCCL may run one on the caller's stream and return none).


def _listed(
    recording: Recording, method: Callable[..., Any], sync_options: Any, async_options: Any
) -> FastPath:
    """For ``method([tensor], options)``: allreduce, broadcast."""
    compiled = _c_fast_path(recording, 0, method, (sync_options, async_options))
    if compiled is not None:
        return compiled

    def start(async_op: bool, tensor: torch.Tensor) -> Any:
        if async_op:  # an async op always returns a Work: no wrap()
            return TorchWork(method([tensor], async_options), (tensor,))
        return method([tensor], sync_options)

    return recording.fast_path(0, start, one_tensor=True)


def _paired(
    recording: Recording, payload: int, method: Callable[..., Any], sync_options: Any, async_options: Any
) -> FastPath:
    """For ``method(output, input, options)``: _allgather_base, _reduce_scatter_base; the entry
    describes tensor ``payload`` (0: the output, 1: the input).

    Both get 1-D views: gloo splits the larger tensor along dim 0 and compares each piece's shape
    with the smaller one, so it refuses a stacked ``(n, *shape)`` output that NCCL accepts.
    """
    compiled = _c_fast_path(recording, 1, method, (sync_options, async_options), payload=payload)
    if compiled is not None:
        return compiled

    def start(async_op: bool, output: torch.Tensor, tensor: torch.Tensor) -> Any:
        flat_output = output if output.dim() == 1 else output.view(-1)
        flat_input = tensor if tensor.dim() == 1 else tensor.view(-1)
        if async_op:
            return TorchWork(method(flat_output, flat_input, async_options), (output,))
        return method(flat_output, flat_input, sync_options)

    return recording.fast_path(payload, start)


def _all_reduce(recording: Recording, process_group: Any, op: ReduceOp) -> FastPath:
    reduce_op = TORCH_OPS[op]
    sync_options = options(torch_dist.AllreduceOptions, False, reduceOp=reduce_op)
    async_options = options(torch_dist.AllreduceOptions, True, reduceOp=reduce_op)
    return _listed(recording, process_group.allreduce, sync_options, async_options)


def _broadcast(recording: Recording, process_group: Any, root: int) -> FastPath:
    # rootRank is a group rank: the ProcessGroup counts its own members.
    sync_options = options(torch_dist.BroadcastOptions, False, rootRank=root)
    async_options = options(torch_dist.BroadcastOptions, True, rootRank=root)
    return _listed(recording, process_group.broadcast, sync_options, async_options)


def _send(recording: Recording, process_group: Any, peer: int, tag: int) -> FastPath:
    return _point_to_point(recording, process_group.send, peer, tag)


def _recv(recording: Recording, process_group: Any, peer: int, tag: int) -> FastPath:
    return _point_to_point(recording, process_group.recv, peer, tag)


def _point_to_point(recording: Recording, method: Callable[..., Any], peer: int, tag: int) -> FastPath:
    """send and recv take no options and always return a Work: the leanest fast path of all.

    Their entries go to the recorder's point-to-point ring (``recording`` says which).
    """
    compiled = _c_fast_path(recording, 2, method, (None, None), (peer, tag))
    if compiled is not None:
        return compiled

    def start(async_op: bool, tensor: torch.Tensor) -> Any:
        torch_work = method([tensor], peer, tag)
        return TorchWork(torch_work, (tensor,)) if async_op else torch_work

    return recording.fast_path(0, start, one_tensor=True)


def _all_gather_into_tensor(recording: Recording, process_group: Any) -> FastPath:
    kind = torch_dist.distributed_c10d.AllgatherOptions
    return _paired(recording, 0, process_group._allgather_base, options(kind, False), options(kind, True))


def _reduce_scatter_tensor(recording: Recording, process_group: Any, op: ReduceOp) -> FastPath:
    kind, reduce_op = torch_dist.ReduceScatterOptions, TORCH_OPS[op]
    return _paired(
        recording,
        1,
        process_group._reduce_scatter_base,
        options(kind, False, reduceOp=reduce_op),
        options(kind, True, reduceOp=reduce_op),
    )


def _all_to_all_single(recording: Recording, process_group: Any) -> FastPath:
    method = process_group.alltoall_base
    sync_options = options(torch_dist.AllToAllOptions, False)
    async_options = options(torch_dist.AllToAllOptions, True)

    def start(
        async_op: bool,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: list[int] | None,
        input_splits: list[int] | None,
    ) -> Any:  # [] is torch's spelling of "equal splits"
        if async_op:
            torch_work = method(output, tensor, output_splits or [], input_splits or [], async_options)
            return TorchWork(torch_work, (output,))
        return method(output, tensor, output_splits or [], input_splits or [], sync_options)

    return recording.fast_path(1, start)


_BUILDERS: dict[str, Callable[..., FastPath]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "send": _send,
    "recv": _recv,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all_single": _all_to_all_single,
}
