"""Choosing backends: parse torch-style backend strings and pick one from the accelerator.

Pure functions of their arguments, so every rule is unit-tested without a device::

    resolve_backend_spec(None, {}, "cuda")                      -> "cpu:gloo,cuda:peermem"
    resolve_backend_spec(None, {}, "cpu")                       -> "shm" (or "gloo" where shm is unavailable)
    resolve_backend_spec(None, {"COMMLAYER_BACKEND": "mpi"}, "cpu") -> "mpi"
    parse_backend_spec("cpu:gloo,cuda:nccl", devices_of)        -> {"cpu": "gloo", "cuda": "nccl"}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

from commlayer.core import settings
from commlayer.core.errors import InvalidArgumentError

__all__ = [
    "BACKEND_ENV",
    "DEFAULT_BY_ACCELERATOR",
    "FALLBACK_BY_DEFAULT",
    "detect_accelerator",
    "device_present",
    "parse_backend_spec",
    "resolve_backend_spec",
]

BACKEND_ENV = settings.BACKEND.name

# On CPU, shm: shared memory between the ranks of each host (a group spanning hosts runs two-level,
# with gloo between hosts; see commlayer.backends.shm).
DEFAULT_BY_ACCELERATOR: Mapping[str, str] = {
    "cpu": "shm",
    # peermem is NCCL with commlayer's own kernels for the intra-host calls they win.
    "cuda": "cpu:gloo,cuda:peermem",
    "xpu": "cpu:gloo,xpu:ccl",
    "npu": "cpu:gloo,npu:hccl",
}

#: What an automatic choice becomes when its backend cannot run here (shm built without a compiler,
#: no /dev/shm).
FALLBACK_BY_DEFAULT: Mapping[str, str] = {"shm": "gloo"}


def detect_accelerator() -> str:
    """The device type this process would train on: cuda, xpu, npu, or cpu."""
    if torch.cuda.is_available():
        return "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    npu = getattr(torch, "npu", None)  # present once torch_npu is imported
    if npu is not None and npu.is_available():
        return "npu"
    return "cpu"


def device_present(device: str) -> bool:
    """Whether this host has device type ``device`` (cpu and device types torch cannot probe: yes).

    A backend string may name devices a host lacks (the CUDA default on a CPU host of the same
    job): no tensor of theirs can exist here, so their backends need not be built.
    """
    probe = getattr(torch, device, None) if device != "cpu" else None
    is_available = getattr(probe, "is_available", None)
    return True if is_available is None else bool(is_available())


def resolve_backend_spec(
    backend: str | None,
    environ: Mapping[str, str],
    accelerator: str,
    available: Callable[[str], bool] = lambda name: True,
) -> str:
    """The backend string to use: the explicit one, else $COMMLAYER_BACKEND, else by accelerator.

    Only the automatic choice falls back (:data:`FALLBACK_BY_DEFAULT`) when ``available(name)`` is
    False; a name the user gave fails loudly instead.
    """
    if backend is not None and str(backend).lower() not in ("", "undefined"):
        return str(backend).lower()
    override = (settings.BACKEND.text(environ) or "").lower()
    if override:
        return override
    if accelerator not in DEFAULT_BY_ACCELERATOR:
        raise InvalidArgumentError(
            f"init_process_group: no default backend for accelerator '{accelerator}'; expected one "
            f"of {sorted(DEFAULT_BY_ACCELERATOR)} or an explicit backend= / ${BACKEND_ENV}"
        )
    choice = DEFAULT_BY_ACCELERATOR[accelerator]
    if choice in FALLBACK_BY_DEFAULT and not available(choice):
        return FALLBACK_BY_DEFAULT[choice]
    return choice


def parse_backend_spec(spec: str, devices_of: Callable[[str], Iterable[str]]) -> dict[str, str]:
    """Map device type -> backend name.

    A bare name serves every device its backend supports (``devices_of(name)``); the torch form
    ``"cpu:gloo,cuda:nccl"`` names one backend per device.
    """
    if ":" not in spec:
        return {device: spec for device in devices_of(spec)}
    mapping: dict[str, str] = {}
    for item in spec.split(","):
        device, sep, name = item.strip().partition(":")
        if not sep or not device or not name or device in mapping:
            raise InvalidArgumentError(
                f"init_process_group: argument 'backend' expected 'name' or 'device:name,...' with "
                f"each device once, received {spec!r}"
            )
        mapping[device] = name
    return mapping
