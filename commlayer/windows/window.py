"""``commlayer.window(tensor, group)``: one-sided puts, gets and signals into peers' memory.

Each member registers a tensor (sizes may differ, the dtype may not); the returned
:class:`Window` lets any member write into (``put``) and read from (``get``) any member's window
without that member's participation, and tell it that its data is there (``signal`` /
``wait_signal``). Backends implement it natively (``shm``: shared memory, ``mpi``: MPI RMA) or,
for every other backend, emulate it with send/recv (:mod:`commlayer.contract.emulated_windows`), where
a put lands at the target's next window call at the latest.

Ranks are global ranks, as everywhere in ``commlayer.dist``; offsets and sizes count elements of
the window's dtype. Completion, on every backend:

- a put's Work completes once the source tensor may be reused; the data is visible at the target
  after the target's ``wait_signal`` for a later ``signal`` from the origin, or after ``fence()``;
- a get's Work completes once the output holds the data;
- ``fence()`` is collective: every put and get issued before it by any member is complete after it.

Example::

    >>> win = commlayer.window(torch.zeros(1024), group=None)
    >>> if dist.get_rank() == 0:
    ...     win.put(torch.ones(4), dst=1, offset=8)
    ...     win.signal(dst=1)
    ... elif dist.get_rank() == 1:
    ...     win.wait_signal(src=0)  # win.tensor[8:12] is now ones
    >>> win.fence()
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from typing import NoReturn

import torch

from commlayer import dist
from commlayer.contract.windows import BackendWindow, WindowSpec, limit_of
from commlayer.core.errors import UnsupportedError, invalid_argument
from commlayer.core.work import Work
from commlayer.facade.calls.op_call import device_type
from commlayer.facade.groups.group import ProcessGroup, resolve_group
from commlayer.windows.validate import check_dtypes_agree, check_peer, check_span, check_tensor, check_timeout

__all__ = ["Window", "window"]

# Windows created per group name, so every member numbers a window alike.
_created: defaultdict[str, int] = defaultdict(int)


def window(tensor: torch.Tensor, group: ProcessGroup | None = None) -> Window | None:
    """Register ``tensor`` as this rank's window over ``group``; collective over the group.

    Args:
        tensor: a contiguous tensor; its contents initialise ``Window.tensor``. Members may
            register different sizes but one dtype.
        group: the group (default: WORLD).

    Returns:
        The :class:`Window`, or None on ranks outside ``group``.
    """
    member = resolve_group("window", group)
    if member is None:
        return None
    me = member.global_rank
    if not isinstance(tensor, torch.Tensor):
        raise invalid_argument("window", "tensor", "a torch.Tensor", type(tensor).__name__, me, TypeError)
    if tensor.dtype not in _STABLE_DTYPES:
        raise invalid_argument(
            "window", "tensor", "a tensor of a standard dtype", tensor.dtype, me, TypeError
        )
    if not tensor.is_contiguous():
        raise invalid_argument("window", "tensor", "a contiguous tensor", f"strides {tensor.stride()}", me)
    backend = member.backend_for(device_type(tensor.device))
    if backend is None:
        raise invalid_argument(
            "window", "tensor", f"a tensor on {' or '.join(member.device_types)}", tensor.device, me
        )
    if tensor.dtype not in backend.capabilities.dtypes:
        raise invalid_argument(
            "window",
            "tensor",
            f"a dtype backend '{backend.name}' declares",
            tensor.dtype,
            me,
            UnsupportedError,
        )
    sizes, dtypes = _exchange_layout(tensor, member)
    check_dtypes_agree(dtypes, member.ranks, me)
    index = _created[member.group_name]
    _created[member.group_name] += 1
    spec = WindowSpec(
        key=f"{member.group_name}/window{index}",
        index=index,
        rank=member.rank(),
        sizes=sizes,
        timeout_s=member.timeout.total_seconds(),
        global_rank=me,
        global_ranks=tuple(member.ranks),
    )
    return Window(backend.window(tensor, spec), member)


def _exchange_layout(tensor: torch.Tensor, group: ProcessGroup) -> tuple[tuple[int, ...], list[torch.dtype]]:
    """Every member's element count and dtype (one all-gather of two int64 per rank)."""
    mine = torch.tensor([tensor.numel(), _stable_code(tensor.dtype)], dtype=torch.int64, device=tensor.device)
    gathered = torch.empty(2 * group.size(), dtype=torch.int64, device=tensor.device)
    dist.all_gather_into_tensor(gathered, mine, group=group)
    pairs = gathered.view(-1, 2).tolist()
    return tuple(numel for numel, _ in pairs), [_STABLE_DTYPES[code] for _, code in pairs]


# Dtypes as the integers the creating all-gather carries: one fixed list, equal in every process.
_STABLE_DTYPES = [
    getattr(torch, name)
    for name in [
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "complex64",
        "complex128",
        "float8_e4m3fn",
        "float8_e5m2",
        "uint16",
        "uint32",
        "uint64",
    ]
    if hasattr(torch, name)
]


def _stable_code(dtype: torch.dtype) -> int:
    return _STABLE_DTYPES.index(dtype)


class Window:
    """One rank's handle of a window; made by :func:`window`, never directly.

    Attributes:
        tensor: this rank's window memory, which peers write into and read from, shaped like the
            registered tensor. It is the registered tensor itself where the library can expose that
            memory (``mpi``, emulated windows), else a copy initialised from it (``shm``: in a
            shared-memory segment); read and write it through this attribute.
        group: the window's group.
    """

    def __init__(self, native: BackendWindow, group: ProcessGroup) -> None:
        self._native = native
        self.group = group
        self.tensor = native.tensor
        self._spec = native.spec
        self._rank = native.spec.global_rank
        self._dtype = native.tensor.dtype
        self._device = native.tensor.device
        self._on_cpu = self._device.type == "cpu"  # then ``is_cpu`` checks the device cheaply
        self._group_ranks = {rank: index for index, rank in enumerate(group.ranks)}
        self._sizes = native.spec.sizes
        self._fast_put = native.fast_put
        self._fast_get = native.fast_get

    def put(self, tensor: torch.Tensor, dst: int, offset: int = 0, *, async_op: bool = False) -> Work | None:
        """Write ``tensor`` into global rank ``dst``'s window at element ``offset``.

        The Work completes once ``tensor`` may be reused; the data is visible at ``dst`` after its
        ``wait_signal`` for a later :meth:`signal`, or after :meth:`fence`.
        """
        if not async_op and self._fast_put is not None and self._fast_put(tensor, dst, offset):
            return None
        peer = self._plain_target(tensor, dst, offset)
        if peer is None:  # anything unusual takes the checks that explain what is wrong
            check_tensor("put", "tensor", tensor, self._dtype, self._device, self._rank)
            peer = check_peer("put", "dst", dst, self._group_ranks, self._rank)
            check_span("put", offset, tensor.numel(), self._sizes[peer], dst, self._rank)
            tensor = tensor.contiguous()
        work = self._native.put(tensor, peer, offset, async_op=async_op)
        return work if async_op else None

    def _plain_target(self, tensor: torch.Tensor, rank: object, offset: object) -> int | None:
        """The group rank of ``rank`` when every argument is plainly valid (a contiguous tensor of
        the window's dtype and device, an int offset whose span fits), else None: the hot path's
        checks, a few attribute reads."""
        peer = self._group_ranks.get(rank) if type(rank) is int else None
        if (
            peer is None
            or type(offset) is not int
            or not isinstance(tensor, torch.Tensor)
            or tensor.dtype is not self._dtype
            or not tensor.is_contiguous()
            or (not tensor.is_cpu if self._on_cpu else tensor.device != self._device)
            or not 0 <= offset <= self._sizes[peer] - tensor.numel()
        ):
            return None
        return peer

    def get(self, tensor: torch.Tensor, src: int, offset: int = 0, *, async_op: bool = False) -> Work | None:
        """Read ``tensor.numel()`` elements of global rank ``src``'s window at ``offset`` into ``tensor``."""
        if not async_op and self._fast_get is not None and self._fast_get(tensor, src, offset):
            return None
        peer = self._plain_target(tensor, src, offset)
        if peer is not None:
            work = self._native.get(tensor, peer, offset, async_op=async_op)
            return work if async_op else None
        check_tensor("get", "tensor", tensor, self._dtype, self._device, self._rank)
        peer = check_peer("get", "src", src, self._group_ranks, self._rank)
        check_span("get", offset, tensor.numel(), self._sizes[peer], src, self._rank)
        if tensor.is_contiguous():
            work = self._native.get(tensor, peer, offset, async_op=async_op)
        else:
            staged = tensor.contiguous()
            work = self._native.get(staged, peer, offset, async_op=async_op).then(
                lambda: tensor.copy_(staged), (tensor,)
            )
            if not async_op:
                work.wait()
        return work if async_op else None

    def signal(self, dst: int, *, async_op: bool = False) -> Work | None:
        """Tell global rank ``dst`` that this rank's earlier puts into its window are done."""
        peer = check_peer("signal", "dst", dst, self._group_ranks, self._rank)
        work = self._native.signal(peer, async_op=async_op)
        return work if async_op else None

    def wait_signal(
        self, src: int, *, timeout: timedelta | float | None = None, async_op: bool = False
    ) -> Work | None:
        """Wait for (and consume) one :meth:`signal` from global rank ``src``.

        Args:
            src: the signalling rank.
            timeout: how long to wait (default: the group's timeout); then CommTimeoutError names ``src``.
            async_op: return a Work instead of waiting.
        """
        peer = check_peer("wait_signal", "src", src, self._group_ranks, self._rank)
        timeout_s = limit_of(timeout, self._spec.timeout_s)
        check_timeout("wait_signal", timeout_s, self._rank)
        work = self._native.wait_signal(peer, timeout_s, async_op=async_op)
        return work if async_op else None

    def fence(self, *, async_op: bool = False) -> Work | None:
        """Collective: every put and get issued before it by any member is complete after it."""
        work = self._native.fence(async_op=async_op)
        return work if async_op else None

    def map(self, peer: int) -> torch.Tensor:
        """A 1-D tensor viewing global rank ``peer``'s window memory, where the ranks share memory
        (``shm``); elsewhere UnsupportedError. Writes through it are plain stores: order them for
        the peer with :meth:`signal` or :meth:`fence`."""
        return self._native.map(check_peer("map", "peer", peer, self._group_ranks, self._rank))

    @property
    def mappable(self) -> bool:
        """Whether :meth:`map` works here."""
        return self._native.mappable

    def free(self) -> None:
        """Collective: fence, then release the window (its ``tensor`` stays readable; every op
        after this raises)."""
        self.fence()
        self._native.close()
        self._fast_put = self._fast_get = None
        self._native = _FreedWindow(self._spec.key, self._rank)  # type: ignore[assignment]

    def __enter__(self) -> Window:  # noqa: PYI034 - py3.10 has no typing.Self
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Freeing is collective: after an error the peers may never get there, so leave it be.
        if exc_info[0] is None:
            self.free()

    def __repr__(self) -> str:
        return f"Window(key={self._spec.key!r}, ranks={list(self.group.ranks)}, dtype={self._dtype})"


class _FreedWindow:
    """What a window's ops reach after :meth:`Window.free`: each raises, naming itself."""

    mappable = False

    def __init__(self, key: str, rank: int) -> None:
        self._key = key
        self._rank = rank

    def __getattr__(self, op: str) -> Callable[..., NoReturn]:
        def refuse(*args: object, **kwargs: object) -> NoReturn:
            raise invalid_argument(op, "self", "a live window", f"window '{self._key}', freed", self._rank)

        return refuse
