"""The ``shm`` backend: collectives through one shared-memory segment per group (csrc/shm).

For groups whose ranks share a host (found through the store, see :mod:`.process_groups`). Each op runs
to completion in the calling thread, in call order, so ranks that disagree on ``async_op`` still
match and an async op returns a completed Work. Every wait spins briefly, then yields the core
with the GIL released, and ends at the group's timeout or as soon as a peer's process is gone.

Native: all_reduce, reduce, broadcast, all_gather(_into_tensor), reduce_scatter(_tensor),
all_to_all(_single) with equal splits, gather, scatter, barrier. Point-to-point ops and
all_to_all_single with listed splits run on a companion gloo group over the same ranks, which is
also the backend's ``torch_group`` (what DDP needs); all_to_all of tensors of several sizes runs
on the generic fallback over its point-to-point ops. A group spanning hosts is a
:class:`~.two_level.TwoLevelBackend`.
"""

from __future__ import annotations

import atexit
import os
import platform
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, ClassVar

import torch
from torch import Tensor

from commlayer.backends.gloo import GlooBackend
from commlayer.backends.shm.native import DTYPE_CODES, OP_CODES, load_extension
from commlayer.backends.shm.options import ShmOptions
from commlayer.backends.shm.segments import build_comm
from commlayer.contract.backend import Backend, StandaloneOptions
from commlayer.contract.fast_paths import FastPath
from commlayer.contract.windows import BackendWindow, WindowSpec
from commlayer.core import health
from commlayer.core.flight_recorder import Recording, prefill
from commlayer.core.hosts import HostMap, exchange_hosts
from commlayer.core.types import ALL_DTYPES, Availability, Capabilities, GroupSpec, ReduceOp, Splits
from commlayer.core.work import CompletedWork, Work

__all__ = ["ShmBackend"]

INSTALL_HINT = "reinstall commlayer from source with a C++17 compiler: pip install --no-build-isolation -e ."


class ShmBackend(Backend):
    """One shared-memory communicator over ranks of one host, plus a gloo companion for p2p."""

    name = "shm"
    # The kernels average themselves (sum, then one division in C++).
    capabilities = Capabilities(
        devices=frozenset({"cpu"}),
        dtypes=ALL_DTYPES,
        recv_any_source=True,
        native_avg=True,
        native_reduce_scatter=True,
    )
    install_hint = INSTALL_HINT
    # Builds the communicator of a group that spans hosts: .two_level registers its subclass's
    # ``build`` here (the package imports it), as this module cannot import its own subclass.
    build_multi_host: ClassVar[Callable[..., Backend] | None] = None
    builds_standalone = True

    def __init__(
        self, spec: GroupSpec, companion: GlooBackend, comm: Any, options: ShmOptions, hosts: HostMap
    ) -> None:
        super().__init__(spec)
        self.options = options
        self.hosts = hosts
        self._companion = companion
        self._comm = comm
        self._pid = os.getpid()  # a forked child inherits the mapping, but never departs for it
        _live_backends.add(self)
        health.add_listener(_stop_waits)

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    def is_available(cls) -> Availability:
        try:
            load_extension()
        except ImportError as error:
            return Availability.no(f"the shm extension is not built: {error}", INSTALL_HINT)
        if not os.access("/dev/shm", os.W_OK):
            return Availability.no("/dev/shm is missing or not writable", "mount a tmpfs on /dev/shm")
        return GlooBackend.is_available()

    @classmethod
    def create_world(cls, spec: GroupSpec) -> Backend:
        options = ShmOptions.resolve(spec.options, spec.global_rank)
        companion = GlooBackend.create_world(replace(spec, options=None))
        return _build(spec, companion, options)

    @classmethod
    def create_standalone(cls, spec: GroupSpec, options: StandaloneOptions) -> Backend:
        """A fresh segment over the members, with a standalone gloo companion (for p2p).

        shm checks no op's signature itself; ``options`` reaches the companion.
        """
        shm_options = ShmOptions.resolve(spec.options, spec.global_rank)
        companion = GlooBackend.create_standalone(replace(spec, options=None), options)
        return _build(spec, companion, shm_options)

    def new_group(self, spec: GroupSpec) -> Backend | None:
        companion = self._companion.new_group(replace(spec, options=None))  # torch: every world rank
        if companion is None:
            return None
        options = self.options if spec.options is None else ShmOptions.resolve(spec.options, spec.global_rank)
        return _build(spec, companion, options)

    def shrink(self, survivors: tuple[int, ...], spec: GroupSpec) -> Backend:
        """A fresh segment over the survivors, with a companion gloo group they build alone."""
        companion = self._companion.shrink(survivors, replace(spec, options=None))
        options = self.options if spec.options is None else ShmOptions.resolve(spec.options, spec.global_rank)
        return _build(spec, companion, options)

    def shutdown(self) -> None:
        self._comm = None  # unmaps the segment once no op holds it
        self._companion.shutdown()

    @contextmanager
    def call_timeout(self, seconds: float) -> Iterator[None]:
        """Every wait of the ops started in the context ends at ``seconds`` (run to completion:
        the op waits in the calling thread, so its deadline is the segment's)."""
        comm = self._comm
        if comm is None or not hasattr(comm, "timeout_s"):  # an extension built before it
            yield
            return
        previous = comm.timeout_s
        comm.timeout_s = min(previous, seconds)
        try:
            yield
        finally:
            comm.timeout_s = previous

    @property
    def torch_group(self) -> Any | None:
        return self._companion.torch_group

    def plan(self, op: str, *fixed: Any) -> FastPath | None:
        """Fast paths: one C function per op, a Work only for async ops (see Backend.plan).

        The fast path reads each tensor's address, element count and dtype itself and runs the op,
        with no Python frame in between: at 8 bytes that is most of the backend's cost.
        """
        return self._fast_path(op, fixed)

    def recorded_plan(self, op: str, fixed: tuple[Any, ...], recording: Recording) -> FastPath | None:
        """:meth:`plan`'s fast paths, entering every call in the flight recorder themselves."""
        payload, _ = _FUSED.get(op, (0, None))
        fast_path = self._fast_path(op, fixed, recording, payload)
        if fast_path is not None:
            prefill(recording.ring)  # it rewrites entries in place: from the first call, no list per call
        return fast_path

    def _fast_path(
        self, op: str, fixed: tuple[Any, ...], recording: Recording | None = None, payload: int = 0
    ) -> Any:
        # An extension built before fast paths existed (a tree not rebuilt yet) plans nothing.
        if type(self) is not ShmBackend or op not in _FUSED or not hasattr(self._comm, "fast_path"):
            return None
        code = _FUSED[op][1](*fixed)
        return self._comm.fast_path(op, code, DTYPE_CODES, CompletedWork, recording, payload)

    def window(self, tensor: torch.Tensor, spec: WindowSpec) -> BackendWindow:
        """A window in shared memory (:mod:`.window`) on one x86-64 host; elsewhere the two-sided one."""
        if type(self) is not ShmBackend or platform.machine() not in ("x86_64", "AMD64"):
            return super().window(tensor, spec)
        from commlayer.backends.shm.window import (
            ShmWindow,  # numpy and mmap only for programs that use windows
        )

        return ShmWindow(tensor, spec, self.spec.store, lambda: self.barrier(async_op=False).wait())

    # --- the mandatory core ----------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> Work:
        self._comm.all_reduce(tensor.data_ptr(), tensor.numel(), DTYPE_CODES[tensor.dtype], OP_CODES[op])
        return CompletedWork((tensor,))

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        code = DTYPE_CODES[tensor.dtype]
        self._comm.all_gather(output.data_ptr(), tensor.data_ptr(), tensor.numel(), code)
        return CompletedWork((output,))

    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool = True) -> Work:
        self._comm.broadcast(tensor.data_ptr(), tensor.numel(), DTYPE_CODES[tensor.dtype], root)
        return CompletedWork((tensor,))

    def barrier(self, *, async_op: bool = True) -> Work:
        self._comm.barrier()
        return CompletedWork()

    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool = True) -> Work:
        return self._companion.send(tensor, dst, tag)

    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool = True) -> Work:
        return self._companion.recv(tensor, src, tag)

    def recv_any(self, tensor: torch.Tensor, tag: int, *, async_op: bool = True) -> Work:
        return self._companion.recv_any(tensor, tag)

    # --- native versions of the fallbacks -------------------------------------------------

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, *, async_op: bool = True) -> Work:
        # Non-roots keep their input, as torch's reduce leaves it: they reduce a scratch copy.
        self.all_reduce(tensor if self.rank == root else tensor.clone(), op)
        return CompletedWork((tensor,))

    def all_gather(
        self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        landing = tensor.new_empty((self.size, tensor.numel()))
        self.all_gather_into_tensor(landing, tensor)
        for row, output in zip(landing, outputs):
            output.copy_(row.view_as(output))
        return CompletedWork(tuple(outputs))

    def reduce_scatter_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        code, count = DTYPE_CODES[tensor.dtype], output.numel()
        self._comm.reduce_scatter(output.data_ptr(), tensor.data_ptr(), count, code, OP_CODES[op])
        return CompletedWork((output,))

    def reduce_scatter(
        self, output: torch.Tensor, inputs: Sequence[torch.Tensor], op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        packed = torch.cat([chunk.reshape(-1) for chunk in inputs])
        return self.reduce_scatter_tensor(output, packed, op)

    def all_to_all_single(
        self, output: Tensor, tensor: Tensor, out_splits: Splits, in_splits: Splits, *, async_op: bool = True
    ) -> Work:
        if out_splits or in_splits or tensor.numel() % self.size:
            # Listed splits, even ones, take gloo's own exchange (whose default check compares every
            # pair's count first): one rank of a valid call may list even splits while another's
            # are uneven, and every rank must take the same path.
            return self._companion.all_to_all_single(output, tensor, out_splits, in_splits, async_op=async_op)
        count = tensor.numel() // self.size
        self._comm.all_to_all(output.data_ptr(), tensor.data_ptr(), count, DTYPE_CODES[tensor.dtype])
        return CompletedWork((output,))

    def all_to_all(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], *, async_op: bool = True
    ) -> Work:
        sizes = {chunk.numel() for chunk in (*inputs, *outputs)}
        if len(sizes) != 1:
            return super().all_to_all(outputs, inputs)
        packed = torch.cat([chunk.reshape(-1) for chunk in inputs])
        landing = torch.empty_like(packed)
        self.all_to_all_single(landing, packed, None, None)
        for row, output in zip(landing.view(self.size, -1), outputs):
            output.copy_(row.view_as(output))
        return CompletedWork(tuple(outputs))

    def gather(
        self, tensor: Tensor, outputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        # An all-gather whose non-roots drop the result: one synchronisation instead of size - 1 sends.
        landing = tensor.new_empty((self.size, tensor.numel()))
        self.all_gather_into_tensor(landing, tensor)
        for row, output in zip(landing, outputs or ()):
            output.copy_(row.view_as(output))
        return CompletedWork(tuple(outputs or ()))

    def scatter(
        self, output: Tensor, inputs: Sequence[Tensor] | None, root: int, *, async_op: bool = True
    ) -> Work:
        if inputs is not None:
            packed = torch.cat([chunk.reshape(-1) for chunk in inputs])
        else:
            packed = output.new_empty(self.size * output.numel())
        self.broadcast(packed, root)
        output.view(-1).copy_(packed.view(self.size, -1)[self.rank])
        return CompletedWork((output,))

    # --- helpers ---------------------------------------------------------------------------


# Ops with a native fast path (csrc/shm/fast_paths.hpp): which tensor argument the flight recorder's
# entry describes (as the facade's plans record them), and what the fixed arguments become.
_FUSED: dict[str, tuple[int, Callable[..., int]]] = {
    "all_reduce": (0, lambda op: OP_CODES[op]),
    "broadcast": (0, lambda root: root),
    "all_gather_into_tensor": (0, lambda: 0),
    "reduce_scatter_tensor": (1, lambda op: OP_CODES[op]),
}


# Every backend with a communicator, for _depart_at_exit (weak: a destroyed group just drops out).
_live_backends: weakref.WeakSet[ShmBackend] = weakref.WeakSet()


def _stop_waits(failure: health.PeerFailure) -> None:
    """A peer the monitor saw die ends this process's waits on its groups at once, even while the
    dead rank's process still exists (a slow exit), instead of at the group's timeout."""
    for backend in list(_live_backends):
        comm = backend._comm
        if comm is not None and hasattr(comm, "interrupt") and failure.rank in backend.spec.ranks:
            comm.interrupt()


def _depart_at_exit() -> None:
    """Mark this process as exiting in every group's segment, so a peer blocked on it raises a peer
    failure at once instead of the group timeout: after ``sys.exit`` the interpreter may run
    atexit handlers and tear torch down for longer than the timeout before the process is gone
    (the 200-run loop saw exactly that under load). Registered at import, so it runs after the
    handlers registered later, such as init's death announcement to the peer monitors."""
    pid = os.getpid()
    for backend in list(_live_backends):
        comm = backend._comm
        # Only the process that joined the group: a forked child's exit is not its parent's.
        if comm is not None and backend._pid == pid and hasattr(comm, "depart"):
            comm.depart()


atexit.register(_depart_at_exit)


def _build(spec: GroupSpec, companion: GlooBackend, options: ShmOptions) -> Backend:
    """The communicator of a new group: shm on one host, two-level across hosts (collective)."""
    prefix = f"commlayer/shm/{spec.name}"
    hosts = exchange_hosts(spec, prefix, os.environ)
    if not hosts.single_host:
        assert ShmBackend.build_multi_host is not None, "commlayer.backends.shm registers it"
        return ShmBackend.build_multi_host(spec, companion, options, hosts, prefix)
    comm = build_comm(spec, prefix, range(spec.size), hosts.pids, options)
    return ShmBackend(spec, companion, comm, options, hosts)
