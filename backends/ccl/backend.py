"""The ``ccl`` backend: Intel oneCCL through commlayer's own pybind11 binding (csrc/ccl/).

No torch C++ API and no ``oneccl_bindings_for_pytorch``: tensors are handed to oneCCL as raw
pointers, and every op returns a :class:`CclWork` wrapping oneCCL's event. Ranks given to the
methods are group ranks, as everywhere in the backend contract.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from commlayer.backends.ccl import native as _native
from commlayer.backends.ccl.bootstrap import Connection, connect, disconnect
from commlayer.backends.ccl.build import BuildUnavailable, build_plan, built_extension, cached_extension
from commlayer.backends.ccl.environment import HostLayout, apply_defaults, usable_cpus
from commlayer.backends.ccl.fast_paths import CclFastPathContext, fast_path
from commlayer.backends.ccl.locate import find_oneccl
from commlayer.backends.ccl.native import (
    CCL_DTYPES,
    CCL_REDUCE_OPS,
    CclWork,
    ExtensionMissing,
    NativeTypes,
    buffer,
)
from commlayer.backends.ccl.window import ChannelWindow, payload_channel
from commlayer.contract.backend import Backend
from commlayer.contract.fast_paths import FastPath
from commlayer.contract.mismatch import group_check
from commlayer.contract.windows import BackendWindow, WindowSpec
from commlayer.core import health, settings
from commlayer.core.errors import CommError
from commlayer.core.flight_recorder import Recording
from commlayer.core.rendezvous import discover
from commlayer.core.shm_files import release_regions_of
from commlayer.core.types import Availability, Capabilities, GroupSpec, ReduceOp, Splits
from commlayer.core.work import WaitLimit, Work

__all__ = ["INSTALL_HINT", "CclBackend"]

INSTALL_HINT = (
    "pip install 'commlayer[ccl]' (oneccl-cpu 2021.14 with its headers and pybind11; the binding then "
    "compiles once, on first use, with the system's C++17 compiler); or prebuild it in a checkout: "
    "pip install pybind11 'oneccl-cpu-devel==2021.14.*', then "
    "COMMLAYER_BUILD_CCL=1 pip install --no-build-isolation -e ."
)


_EXPIRED_ADVICE = "This communicator cannot be used any more."


class CclBackend(Backend):
    """One oneCCL communicator over ``spec.ranks``."""

    name = "ccl"
    capabilities = Capabilities(
        devices=frozenset({"cpu"}), dtypes=CCL_DTYPES, reduce_ops=CCL_REDUCE_OPS, p2p_tags=False
    )
    install_hint = INSTALL_HINT

    def __init__(self, spec: GroupSpec, native: ModuleType, connection: Connection) -> None:
        super().__init__(spec)
        self._native = native
        self._types = NativeTypes.of(native)
        self._where = f"group '{spec.name}', rank {spec.global_rank}"  # for error messages
        self._limit = WaitLimit(
            spec.timeout.total_seconds(), spec.global_rank, "oneCCL", _EXPIRED_ADVICE, spec.name
        )
        self._connection: Connection | None = connection
        self._expired: str | None = None  # why the communicator became unusable
        # oneCCL alone returns garbage for a dtype of one element size (float32 against int32) and
        # on the rank with the larger count: each collective's signature is compared first, as on
        # gloo (:mod:`commlayer.contract.mismatch`; tests/reliability/test_faults_defaults.py).
        checked = spec.size > 1 and settings.CCL_VERIFY.value()
        self._signer = group_check(spec, _SignatureChannel(self), "ccl") if checked else None
        _open_backends.add(self)

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    def is_available(cls) -> Availability:
        try:
            _load_native(build=False)
        except ExtensionMissing as error:
            if _native.prebuilt_missing(error):
                return _buildable()
            install = find_oneccl(require_headers=False)
            where = f"oneCCL found at {install.prefix}" if install else "oneCCL is not installed"
            return Availability.no(f"the oneCCL extension is not built ({where}): {error}", INSTALL_HINT)
        return Availability.yes()

    @classmethod
    def create_world(cls, spec: GroupSpec) -> CclBackend:
        native = _load_native(spec.timeout, _host_layout(spec))
        if hasattr(native, "set_abort"):  # an extension built before set_abort existed lacks it
            native.set_abort(False)
        health.add_listener(_stop_native_waits)
        return cls(spec, native, connect(spec, native))

    def new_group(self, spec: GroupSpec) -> CclBackend | None:
        # Only members talk: the group's own KVS replaces torch's "every rank calls new_group".
        if not spec.is_member:
            return None
        return type(self)(spec, self._native, connect(spec, self._native))

    def shrink(self, survivors: tuple[int, ...], spec: GroupSpec) -> CclBackend:
        """A fresh communicator over the survivors through its own KVS; the waits a dead peer
        stopped may run again (the group that had it is aborted by the facade)."""
        if hasattr(self._native, "set_abort"):
            self._native.set_abort(False)
        return type(self)(spec, self._native, connect(spec, self._native))

    def shutdown(self) -> None:
        connection, self._connection = self._connection, None
        _open_backends.discard(self)
        if connection is None:
            return
        if health.current() is not None:
            connection.abandon()  # its teardown would wait on a peer that is gone or stuck
            connection.release()
            _open_backends.leaked = True
            return
        disconnect(self.spec, connection)

    @property
    def kvs_address(self) -> str:
        """``ip_port`` of the oneCCL KVS this communicator was built from (for diagnostics)."""
        return self._live().address

    def recorded_plan(self, op: str, fixed: tuple[Any, ...], recording: Recording) -> FastPath | None:
        """The fast path of a planned collective (see Backend.recorded_plan and fast_paths.py)."""
        methods = functools.partial(getattr, self)
        context = CclFastPathContext(
            size=self.size,
            limit=self._limit,
            op_method=methods,
            types=self._types,
            signer=self._signer,
            live=self._live,
            expire=self._expire,
        )
        return fast_path(context, op, fixed, recording)

    # --- the mandatory core ----------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True) -> Work:
        self._verify("all_reduce", tensor, tensor.numel(), reduce_op=op)
        pointer, count = buffer(tensor)
        post = lambda c, red: c.allreduce(pointer, pointer, count, self._dtype(tensor), red)
        return self._reduction("all_reduce", post, op, tensor, [tensor])

    def all_gather_into_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        self._verify("all_gather_into_tensor", tensor, tensor.numel())
        source, count = buffer(tensor)
        event = self._live().communicator.allgather(source, output.data_ptr(), count, self._dtype(tensor))
        return self._work(event, "all_gather_into_tensor", [output], [tensor])

    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool = True) -> Work:
        self._verify("broadcast", tensor, tensor.numel(), root=root)
        pointer, count = buffer(tensor)
        event = self._live().communicator.broadcast(pointer, count, self._dtype(tensor), root)
        return self._work(event, "broadcast", [tensor])

    def barrier(self, *, async_op: bool = True) -> Work:
        return self._work(self._live().communicator.barrier(), "barrier")

    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool = True) -> Work:
        pointer, count = buffer(tensor)
        event = self._live().communicator.send(pointer, count, self._dtype(tensor), dst, tag)
        return self._work(event, "send", keep_alive=[tensor])

    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool = True) -> Work:
        pointer, count = buffer(tensor)
        event = self._live().communicator.recv(pointer, count, self._dtype(tensor), src, tag)
        return self._work(event, "recv", [tensor])

    def window(self, tensor: torch.Tensor, spec: WindowSpec) -> BackendWindow:
        # oneCCL ignores tags, so each window's payloads go over a gloo channel of their own.
        return ChannelWindow(payload_channel(self.spec, spec), self.spec.store, tensor, spec)

    # --- native versions of the generic fallbacks -----------------------------------------

    def reduce(self, tensor: torch.Tensor, root: int, op: ReduceOp, *, async_op: bool = True) -> Work:
        # In place: oneCCL leaves a non-root rank's buffer as it was.
        self._verify("reduce", tensor, tensor.numel(), root=root, reduce_op=op)
        pointer, count = buffer(tensor)
        post = lambda c, red: c.reduce(pointer, pointer, count, self._dtype(tensor), red, root)
        return self._reduction("reduce", post, op, tensor, [tensor])

    def all_gather(
        self, outputs: Sequence[torch.Tensor], tensor: torch.Tensor, *, async_op: bool = True
    ) -> Work:
        self._verify("all_gather", tensor, tensor.numel())
        source, count = buffer(tensor)
        targets = [output.data_ptr() for output in outputs]
        event = self._live().communicator.allgatherv_list(
            source, count, targets, [count] * self.size, self._dtype(tensor)
        )
        return self._work(event, "all_gather", list(outputs), [tensor])

    def reduce_scatter_tensor(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool = True
    ) -> Work:
        self._verify("reduce_scatter_tensor", tensor, output.numel(), reduce_op=op)
        source, target, count = tensor.data_ptr(), output.data_ptr(), output.numel()
        post = lambda c, red: c.reduce_scatter(source, target, count, self._dtype(tensor), red)
        return self._reduction("reduce_scatter_tensor", post, op, tensor, [output])

    def all_to_all_single(
        self, output: Tensor, tensor: Tensor, out_splits: Splits, in_splits: Splits, *, async_op: bool = True
    ) -> Work:
        if self._signer is not None:
            self._signer.verify_all_to_all_single("all_to_all_single", output, tensor, out_splits, in_splits)
        communicator, dtype = self._live().communicator, self._dtype(tensor)
        if not out_splits and not in_splits:
            count = tensor.numel() // self.size
            event = communicator.alltoall(tensor.data_ptr(), output.data_ptr(), count, dtype)
        else:
            send_counts = _element_counts(tensor, in_splits, self.size)
            recv_counts = _element_counts(output, out_splits, self.size)
            event = communicator.alltoallv(
                tensor.data_ptr(), send_counts, output.data_ptr(), recv_counts, dtype
            )
        return self._work(event, "all_to_all_single", [output], [tensor])

    def all_to_all(
        self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], *, async_op: bool = True
    ) -> Work:
        if self._signer is not None:
            self._signer.verify_all_to_all("all_to_all", outputs, inputs)
        # oneCCL's alltoallv takes one flat buffer per side (per-rank buffers are rejected).
        flat_in = torch.cat([chunk.reshape(-1) for chunk in inputs])
        flat_out = flat_in.new_empty(sum(output.numel() for output in outputs))
        event = self._live().communicator.alltoallv(
            flat_in.data_ptr(),
            [chunk.numel() for chunk in inputs],
            flat_out.data_ptr(),
            [output.numel() for output in outputs],
            self._dtype(flat_in),
        )
        work = self._work(event, "all_to_all", [], [flat_in, flat_out])
        return work.then(lambda: _unflatten_into(flat_out, outputs))

    # --- helpers ---------------------------------------------------------------------------

    def _verify(
        self, op: str, tensor: torch.Tensor, count: int, root: int = -1, reduce_op: ReduceOp | None = None
    ) -> None:
        if self._signer is not None:
            self._signer.verify(op, tensor.dtype, count, root, reduce_op)

    def post_max(self, values: torch.Tensor) -> Work:
        """An element-wise MAX all-reduce of ``values`` in place, unchecked: the check's own."""
        pointer, count = buffer(values)
        reduction = self._types.reductions[ReduceOp.MAX]
        event = self._live().communicator.allreduce(pointer, pointer, count, self._dtype(values), reduction)
        return self._work(event, "all_reduce", [values])

    def _live(self) -> Connection:
        if self._connection is not None and self._expired is None:
            return self._connection
        if self._expired is not None:
            raise CommError(f"ccl: {self._where}: cannot be used after an op timed out: {self._expired}")
        raise CommError(f"ccl: {self._where}: the communicator was shut down")

    def _expire(self, message: str) -> None:
        self._expired = message
        _open_backends.leaked = True  # oneCCL leaks a communicator with an op still in flight

    def _dtype(self, tensor: torch.Tensor) -> Any:
        return self._types.datatypes[tensor.dtype]

    def _work(
        self,
        event: Any,
        op: str,
        result: Sequence[torch.Tensor] = (),
        keep_alive: Sequence[torch.Tensor] = (),
    ) -> CclWork:
        return CclWork(event, op, self._limit, self._expire, result, (*result, *keep_alive))

    def _reduction(
        self,
        op_name: str,
        post: Callable[[Any, Any], Any],
        op: ReduceOp,
        source: torch.Tensor,
        results: list[torch.Tensor],
    ) -> Work:
        """Post a reducing op (never AVG: the facade sums and divides for backends without it)."""
        event = post(self._live().communicator, self._types.reductions[op])
        return self._work(event, op_name, results, [source])


class _SignatureChannel:
    """The one ProcessGroup method the mismatch check's reduction calls, ``allreduce([values], opts)`` (always a
    MAX over int64), posted on a oneCCL communicator."""

    __slots__ = ("_backend",)

    def __init__(self, backend: CclBackend) -> None:
        self._backend = backend

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        return self._backend.post_max(tensors[0])


class _OpenBackends:
    """Communicators not shut down yet; released in reverse creation order at interpreter exit.

    A script that never calls destroy_process_group would otherwise have its communicators
    destroyed in arbitrary order during interpreter teardown, which oneCCL does not survive.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._backends: list[CclBackend] = []
        # A communicator was leaked: libfabric then never removes this process's /dev/shm region.
        self.leaked = False

    def add(self, backend: CclBackend) -> None:
        with self._lock:
            self._backends.append(backend)

    def discard(self, backend: CclBackend) -> None:
        with self._lock:
            self._backends = [other for other in self._backends if other is not backend]

    def shutdown_all(self) -> None:
        with self._lock:
            newest_first = self._backends[::-1]
        for backend in newest_first:
            backend.shutdown()
        if self.leaked:
            release_regions_of([os.getpid()])


_open_backends = _OpenBackends()
atexit.register(_open_backends.shutdown_all)


def _stop_native_waits(failure: health.PeerFailure) -> None:
    """A dead peer ends every pending oneCCL wait at once instead of at the group's timeout."""
    native = _native.load_extension()
    if hasattr(native, "set_abort"):
        native.set_abort(True)


def _host_layout(spec: GroupSpec) -> HostLayout:
    """The launcher's local layout; without one, assume every rank of the world shares this host."""
    try:
        found = discover(os.environ)
    except ValueError:  # malformed launcher variables: init_process_group reports those itself
        found = None
    if found is None:
        return HostLayout(local_rank=None, local_size=spec.size, cpus=usable_cpus())
    return HostLayout(found.local_rank, found.local_world_size, usable_cpus())


def _load_native(
    timeout: timedelta | None = None, host: HostLayout | None = None, build: bool = True
) -> ModuleType:
    """Set oneCCL's environment (when a world is being built), preload libccl, import the extension:
    the prebuilt one, else the one built on first use (compiled now unless ``build`` is False)."""
    install = find_oneccl(require_headers=False)
    if timeout is not None and host is not None:
        apply_defaults(install, timeout, host)
    if install is not None:
        # The extension's rpath names the lib folder it was built against; loading the runtime
        # library found now by its soname first keeps a moved or rebuilt environment working.
        try:
            ctypes.CDLL(str(install.library), mode=ctypes.RTLD_GLOBAL)
        except OSError as error:
            raise ExtensionMissing(f"cannot load {install.library}: {error}") from error
    try:
        return _native.load_extension()
    except ExtensionMissing as missing:
        if not _native.prebuilt_missing(missing):
            raise
        return _load_built(missing, build)


def _load_built(missing: ExtensionMissing, build: bool) -> ModuleType:
    """The binding of the first-use build; ``missing`` again when there is none and ``build`` is off."""
    try:
        plan = build_plan(find_oneccl(require_headers=True))
        path = built_extension(plan) if build else cached_extension(plan)
    except BuildUnavailable as error:
        raise ExtensionMissing(f"{missing}; and it cannot be built here: {error}") from error
    if path is None:
        raise missing
    return _native.load_built(path)


def _buildable() -> Availability:
    """No extension yet: available when the first world can build it."""
    try:
        plan = build_plan(find_oneccl(require_headers=True))
    except BuildUnavailable as error:
        return Availability.no(
            f"the oneCCL extension is not built and cannot be built here: {error}", INSTALL_HINT
        )
    return Availability(True, f"its binding compiles on first use, into {plan.cache_folder}")


def _element_counts(tensor: torch.Tensor, splits: Sequence[int] | None, parts: int) -> list[int]:
    """Per-rank element counts of a dim-0 split (rows x elements per row)."""
    if not splits:
        return [tensor.numel() // parts] * parts
    row = tensor[0].numel() if tensor.shape[0] else 0
    return [split * row for split in splits]


def _unflatten_into(flat: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    offset = 0
    for output in outputs:
        output.copy_(flat[offset : offset + output.numel()].view_as(output))
        offset += output.numel()
