"""Attaching a group: each rank's region and the group's board, agreed on through the group's store.

Attaching is collective over the group's members. Each rank allocates its region and posts its
IPC handle, its host and its GPU to the store; group rank 0 also creates the board
(:mod:`.board`) and posts its name. The kernels serve the group only when every member is on one
host, on its own GPU, and every mapping succeeded, which the members agree on through the store
too. Otherwise :func:`attach` returns None and every call goes to NCCL.
"""

from __future__ import annotations

import ctypes
import json
import logging
import socket
from pathlib import Path

import torch

from commlayer.backends.peermem import board as boards
from commlayer.backends.peermem.communicator import PeerComm
from commlayer.backends.peermem.kernel_library import KernelLibrary, load_library
from commlayer.core import settings
from commlayer.core.types import GroupSpec

__all__ = ["attach", "duplicate_devices", "host_identity", "store_prefix"]

_log = logging.getLogger(__name__)


def host_identity() -> str:
    """This host's name and boot id: equal exactly for processes of one machine."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def store_prefix(spec: GroupSpec) -> str:
    return f"commlayer/peermem/{spec.name}"


def duplicate_devices(devices: list[str]) -> str:
    """Why ranks posting these GPU identities cannot share peer memory ("" when they can)."""
    seen: dict[str, int] = {}
    for rank, device in enumerate(devices):
        if device in seen:
            return (
                f"group ranks {seen[device]} and {rank} are on the same GPU ({device}); call "
                "torch.cuda.set_device(LOCAL_RANK) before init_process_group"
            )
        seen[device] = rank
    return ""


def _local_attach(spec: GroupSpec, half_bytes: int) -> tuple[KernelLibrary | None, int | None, bytes, str]:
    """This rank's library, region and IPC handle, or the reason it has none."""
    if not (2 <= spec.size <= boards.MAX_RANKS):
        return None, None, b"", f"group of {spec.size} ranks (the kernels serve 2 to {boards.MAX_RANKS})"
    if not settings.PEERMEM.value():
        return None, None, b"", f"${settings.PEERMEM.name}=0"
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
    prefix = store_prefix(spec)
    spec.store.set(f"{prefix}/{key}/{spec.group_rank}", value.encode())
    return [spec.store.get(f"{prefix}/{key}/{rank}").decode() for rank in range(spec.size)]


def _device_identity() -> str:
    try:
        return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    except Exception:  # noqa: BLE001 - without one, the group is served as before
        return f"cuda:{torch.cuda.current_device()}"


def _open_all(lib: KernelLibrary, handle: int, peers: list[dict]) -> str:
    """Map every peer's region; the first failure's reason, or ""."""
    for rank, peer in enumerate(peers):
        rc = lib.lib.pm_open(handle, rank, bytes.fromhex(peer["ipc"]))
        if rc:
            return f"mapping rank {rank}'s region failed: {lib.error_string(rc)}"
    return ""


def attach(spec: GroupSpec) -> PeerComm | None:
    """Map the group's regions and board (collective over its members); None when NCCL must serve it."""
    half_bytes = int(settings.PEERMEM_BYTES.value())
    lib, handle, ipc, reason = _local_attach(spec, half_bytes)
    board = None
    if lib is not None and spec.group_rank == 0:
        try:
            board = boards.create(f"commlayer-peermem-{spec.name}".replace("/", "_"))
        except OSError as error:
            reason = f"creating the group's board failed: {error}"
    mine = {"host": host_identity(), "ipc": ipc.hex(), "why": reason, "gpu": _device_identity()}
    mine["board"] = str(board.path) if board is not None else ""
    peers = [json.loads(text) for text in _all_posted(spec, "handle", json.dumps(mine))]
    problem = next((peer["why"] for peer in peers if peer["why"]), "")
    if not problem and len({peer["host"] for peer in peers}) != 1:
        problem = "the group spans hosts"
    if not problem:
        problem = duplicate_devices([peer["gpu"] for peer in peers])
        if problem:
            _log.warning("peermem: NCCL serves group '%s': %s", spec.name, problem)
    if not problem and lib is not None:
        problem = _open_all(lib, handle, peers)
        if not problem and board is None:
            try:
                board = boards.open_board(peers[0]["board"])
            except OSError as error:
                problem = f"opening the group's board failed: {error}"
    agreed = _all_posted(spec, "opened", problem or "")
    if board is not None and spec.group_rank == 0:
        board.unlink()  # every member has mapped it (or given up): the name is no longer needed
    if lib is None or any(agreed):
        if reason or problem:
            _log.info("peermem: NCCL serves group '%s': %s", spec.name, problem or reason)
        if lib is not None and handle is not None:
            lib.lib.pm_destroy(handle)
        if board is not None:
            board.close()
        return None
    return PeerComm(lib, handle, spec, torch.cuda.current_device(), half_bytes, board)
