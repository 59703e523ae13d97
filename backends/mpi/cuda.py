"""CUDA tensors on MPI: hand device pointers to a CUDA-aware library, else stage through the host.

Whether the loaded library is CUDA-aware is asked of the library itself through its extension
query (Open MPI's ``MPIX_Query_cuda_support``, MPICH / Intel MPI's ``MPIX_GPU_query_support``);
``COMMLAYER_MPI_CUDA_AWARE=1|0`` overrides the answer (some libraries support CUDA without
exporting either query). MPI is not stream-aware: before a device pointer is handed over, the
tensor's current stream is synchronised, so queued kernels have finished writing it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from commlayer.core import settings

__all__ = [
    "CUDA_AWARE_ENV",
    "copy_back",
    "cuda_aware",
    "on_host",
    "synchronize_producers",
    "warn_staging_once",
]

log = logging.getLogger("commlayer.backends.mpi")

CUDA_AWARE_ENV = settings.MPI_CUDA_AWARE.name
_SONAMES = ("libmpi.so.40", "libmpi.so.12", "libmpi.so")
_MPIX_GPU_SUPPORT_CUDA = 0  # MPICH's enum value for CUDA in MPIX_GPU_query_support


def cuda_aware(environ: Mapping[str, str]) -> bool:
    """Whether device pointers may be handed to the loaded MPI library."""
    override = settings.MPI_CUDA_AWARE.value(environ)
    if override is not None:
        return bool(override)
    library = _loaded_libmpi()
    return library is not None and _library_reports_cuda(library)


def _loaded_libmpi() -> ctypes.CDLL | None:
    """The libmpi mpi4py already loaded (RTLD_NOLOAD never loads a second one)."""
    for soname in _SONAMES:
        try:
            return ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
    return None


def _library_reports_cuda(library: ctypes.CDLL) -> bool:
    query = getattr(library, "MPIX_Query_cuda_support", None)
    if query is not None:
        query.restype = ctypes.c_int
        return bool(query())
    query = getattr(library, "MPIX_GPU_query_support", None)
    if query is not None:
        supported = ctypes.c_int(0)
        query.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        return query(_MPIX_GPU_SUPPORT_CUDA, ctypes.byref(supported)) == 0 and bool(supported.value)
    return False


def synchronize_producers(tensor: torch.Tensor) -> None:
    """Wait for the kernels queued on ``tensor``'s current stream before MPI touches it."""
    torch.cuda.current_stream(tensor.device).synchronize()


def on_host(value: Any) -> Any:
    """A host copy of a CUDA tensor, or of each one in a list; anything else unchanged."""
    if isinstance(value, torch.Tensor):
        return value.cpu() if value.is_cuda else value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return [on_host(item) for item in value]
    return value


def copy_back(device_values: Sequence[Any], host_values: Sequence[Any]) -> None:
    """Copy each staged output back onto its device tensor (lists element by element)."""
    for device_value, host_value in zip(device_values, host_values):
        if isinstance(device_value, torch.Tensor):
            if device_value is not host_value:
                device_value.copy_(host_value)
        elif isinstance(device_value, (list, tuple)):
            copy_back(device_value, host_value)


@functools.cache
def warn_staging_once(library: str) -> None:
    """Say once per library that its CUDA tensors go through host memory."""
    log.warning(
        "mpi: %s is not CUDA-aware (or does not say so); CUDA tensors are staged through host "
        "memory. Set %s=1 if the library supports CUDA.",
        library,
        CUDA_AWARE_ENV,
    )
