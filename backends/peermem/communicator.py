"""One group's peer-mapped regions: attached through the group's store, launched through ctypes.

Attaching is collective over the group's members. Each rank allocates its region, posts its IPC
handle and host identity to the store, and maps every peer's; the kernels serve the group only
when every member is on one host and every mapping succeeded, which the members agree on through
the store too. Otherwise :func:`attach` returns None and every call goes to NCCL.
"""

from __future__ import annotations

import ctypes
import json
import logging
import socket
from datetime import timedelta
from pathlib import Path

import torch

from commlayer.backends.peermem.kernel_library import KernelLibrary, load_library
from commlayer.backends.peermem.routing import CROSSOVERS, KERNEL_DTYPES, choose, grid_blocks
from commlayer.core import settings
from commlayer.core.errors import CommTimeoutError
from commlayer.core.types import GroupSpec, ReduceOp
from commlayer.core.work import Work

__all__ = [
    "DISABLE_ENV",
    "HALF_BYTES_ENV",
    "KINDS",
    "OP_CODES",
    "PeerComm",
    "PeerWork",
    "attach",
    "host_identity",
    "timeout_error",
]

_log = logging.getLogger(__name__)

DISABLE_ENV = settings.PEERMEM.name
HALF_BYTES_ENV = settings.PEERMEM_BYTES.name
DEFAULT_HALF_BYTES = 32 << 20
KINDS = {("all_reduce", "one_shot"): 0, ("all_reduce", "two_shot"): 1}
KINDS.update({("all_gather_into_tensor", "one_shot"): 2, ("reduce_scatter_tensor", "one_shot"): 3})
KINDS.update({("all_reduce", "push"): 4, ("reduce_scatter_tensor", "push"): 5})
OP_CODES = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MIN: 2, ReduceOp.MAX: 3, ReduceOp.AVG: 4}


def host_identity() -> str:
    """This host's name and boot id: equal exactly for processes of one machine."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class PeerWork(Work):
    """A kernel on the caller's stream: ordered already, so a wait only reports a peer's timeout
    and, for a wait on another stream than the launch's, makes that stream wait for the kernel."""

    __slots__ = ("_comm", "_event")

    def __init__(
        self, comm: PeerComm, result: tuple[torch.Tensor, ...], event: torch.cuda.Event | None
    ) -> None:
        self._result = result
        self._comm = comm
        self._event = event

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        if self._comm.failed.value:
            self._comm.raise_if_failed("wait")
        if self._event is not None:
            self._event.wait(torch.cuda.current_stream(self._comm.device))
        return True

    def is_completed(self) -> bool:
        return self.wait()

    def _test(self) -> bool:
        return self.wait()

    def _block(self, timeout_s: float | None) -> bool:
        return self.wait()


class PeerComm:
    """A group's mapped regions and the launcher of its kernels."""

    def __init__(
        self, lib: KernelLibrary, handle: int, spec: GroupSpec, device: int, half_bytes: int
    ) -> None:
        self.lib, self.handle, self.spec, self.device = lib, handle, spec, device
        self.half_bytes = half_bytes
        self.world = spec.size
        self.forced = settings.PEERMEM_ALGORITHM.value()
        self.table = CROSSOVERS
        self._routes: dict[tuple[str, int, torch.dtype, ReduceOp | None], tuple[int, int] | None] = {}
        self._launch = lib.launch
        self._stream = torch._C._cuda_getCurrentRawStream
        #: Nonzero once a call of this group timed out (host-mapped, written by the kernel).
        self.failed = ctypes.c_int.from_address(lib.lib.pm_error_address(handle))

    def route(
        self, op: str, nbytes: int, dtype: torch.dtype, reduce_op: ReduceOp | None
    ) -> tuple[int, int] | None:
        """``(code, blocks)`` for the kernel that serves this kind of call, or None for NCCL."""
        key = (op, nbytes, dtype, reduce_op)
        try:
            return self._routes[key]
        except KeyError:
            pass
        route = None
        dtype_code = KERNEL_DTYPES.get(dtype)
        op_code = OP_CODES.get(reduce_op, 0) if reduce_op is not None else 0
        if dtype_code is not None and (reduce_op is None or reduce_op in OP_CODES):
            algorithm = choose(self.table, op, nbytes, self.world, self.half_bytes, self.forced)
            if algorithm != "nccl":
                code = KINDS[op, algorithm] | dtype_code << 4 | op_code << 8
                route = (code, grid_blocks(op, algorithm, nbytes, self.world))
        self._routes[key] = route
        return route

    def launch(
        self, route: tuple[int, int], source: torch.Tensor, output: torch.Tensor, nbytes: int, async_op: bool
    ) -> Work | None:
        """Start the kernel on the current stream; ``nbytes`` is what the kernel's ``bytes`` means.

        Returns None when the tensors are not 16-byte aligned: the caller then uses NCCL.
        """
        code, blocks = route
        rc = self._launch(
            self.handle, code, source.data_ptr(), output.data_ptr(), nbytes, blocks, self._stream(self.device)
        )
        if rc:
            if rc == -3:
                return None
            self._fail(rc)
        event = None
        if async_op:
            event = torch.cuda.Event()
            event.record()
        return PeerWork(self, (output,), event)

    def _fail(self, rc: int) -> None:
        if rc == -2:
            self.raise_if_failed("collective")
        raise RuntimeError(
            f"peermem: kernel launch failed on rank {self.spec.group_rank}: {self.lib.error_string(rc)}"
        )

    def raise_if_failed(self, name: str) -> None:
        """Raise CommTimeoutError, naming the peer, once any earlier call of this group timed out."""
        peer, block = ctypes.c_int(), ctypes.c_int()
        if self.lib.lib.pm_error(self.handle, ctypes.byref(peer), ctypes.byref(block)):
            raise timeout_error(self.spec, peer.value, name)

    def close(self) -> None:
        """Free the region once every member has stopped using it (or the wait for them ended)."""
        if self.handle is None:
            return
        torch.cuda.synchronize(self.device)
        prefix = _prefix(self.spec)
        self.spec.store.set(f"{prefix}/closed/{self.spec.group_rank}", b"1")
        keys = [f"{prefix}/closed/{rank}" for rank in range(self.world)]
        try:
            self.spec.store.wait(keys, min(self.spec.timeout, timedelta(seconds=60)))
        except Exception as error:  # noqa: BLE001 - a dead peer must not keep this rank's memory forever
            _log.warning(
                "peermem: freeing group '%s' without every peer's goodbye: %s", self.spec.name, error
            )
        self.lib.lib.pm_destroy(self.handle)
        self.handle = None


def timeout_error(spec: GroupSpec, missing: int, name: str) -> CommTimeoutError:
    """The error of a call whose kernel waited ``spec.timeout`` for group rank ``missing``."""
    return CommTimeoutError(
        f"peermem {name}: group rank {missing} (global rank {spec.ranks[missing]}) did not reach a "
        f"collective within {spec.timeout} (group '{spec.name}', waiting rank {spec.group_rank}); "
        "the group's peer-memory state is unusable: destroy the group"
    )


def _prefix(spec: GroupSpec) -> str:
    return f"commlayer/peermem/{spec.name}"


def _local_attach(spec: GroupSpec, half_bytes: int) -> tuple[KernelLibrary | None, int | None, bytes, str]:
    """This rank's library, region and IPC handle, or the reason it has none."""
    if not (2 <= spec.size <= 8):
        return None, None, b"", f"group of {spec.size} ranks (the kernels serve 2 to 8)"
    if not settings.PEERMEM.value():
        return None, None, b"", f"${DISABLE_ENV}=0"
    try:
        device = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(device)
        lib = load_library(f"sm_{major}{minor}")
        handle = ctypes.c_void_p()
        ipc = ctypes.create_string_buffer(lib.handle_bytes)
        timeout_ns = int(spec.timeout.total_seconds() * 1e9)
        args = (device, spec.group_rank, spec.size, half_bytes, timeout_ns, ctypes.byref(handle), ipc)
        rc = lib.lib.pm_create(*args)
        if rc:
            return None, None, b"", f"allocating the region failed: {lib.error_string(rc)}"
        return lib, handle.value, ipc.raw, ""
    except Exception as error:  # noqa: BLE001 - any failure here only means NCCL serves the group
        return None, None, b"", f"{type(error).__name__}: {error}"


def _all_posted(spec: GroupSpec, key: str, value: str) -> list[str]:
    prefix = _prefix(spec)
    spec.store.set(f"{prefix}/{key}/{spec.group_rank}", value.encode())
    return [spec.store.get(f"{prefix}/{key}/{rank}").decode() for rank in range(spec.size)]


def attach(spec: GroupSpec) -> PeerComm | None:
    """Map the group's regions (collective over its members); None when NCCL must serve it."""
    half_bytes = int(settings.PEERMEM_BYTES.value())
    lib, handle, ipc, reason = _local_attach(spec, half_bytes)
    posted = _all_posted(
        spec, "handle", json.dumps({"host": host_identity(), "ipc": ipc.hex(), "why": reason})
    )
    peers = [json.loads(text) for text in posted]
    usable = all(not peer["why"] for peer in peers) and len({peer["host"] for peer in peers}) == 1
    opened = ""
    if usable and lib is not None:
        for rank, peer in enumerate(peers):
            rc = lib.lib.pm_open(handle, rank, bytes.fromhex(peer["ipc"]))
            if rc:
                opened = f"mapping rank {rank}'s region failed: {lib.error_string(rc)}"
                break
    agreed = _all_posted(spec, "opened", opened if usable else "unused")
    if lib is None or not usable or any(agreed):
        if lib is not None and handle is not None:
            lib.lib.pm_destroy(handle)
        return None
    return PeerComm(lib, handle, spec, torch.cuda.current_device(), half_bytes)
