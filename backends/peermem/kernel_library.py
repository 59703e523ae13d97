"""The peer-memory kernels' shared library: built with nvcc at first use, cached, loaded by ctypes.

The cache key is the hash of the sources (kernels.cu and the headers beside it) and the device's
compute capability, so an edited source or another GPU builds anew; concurrent ranks build once
under a file lock.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from commlayer.core import settings

__all__ = ["CACHE_ENV", "KernelLibrary", "cache_path", "load_library"]

CACHE_ENV = settings.PEERMEM_CACHE.name
# A wheel carries the source as package data; a checkout (or an editable install) has it in csrc/.
_SOURCE_PLACES = (
    Path(__file__).resolve().parent / "_csrc" / "kernels.cu",
    Path(__file__).resolve().parents[2] / "csrc" / "peermem" / "kernels.cu",
)
SOURCE = next((place for place in _SOURCE_PLACES if place.exists()), _SOURCE_PLACES[-1])
#: Every file the build reads: kernels.cu includes the headers beside it.
SOURCES = (SOURCE, *sorted(SOURCE.parent.glob("*.cuh")), *sorted(SOURCE.parent.glob("*.h")))


def source_bytes() -> bytes:
    """The sources' contents, named, in a fixed order: what the cache key hashes."""
    return b"".join(path.name.encode() + b"\0" + path.read_bytes() for path in SOURCES)


def cache_path(source: bytes, arch: str, cache_root: str | None = None) -> Path:
    """Where the library built from ``source`` for ``arch`` (e.g. ``sm_90``) is kept."""
    root = Path(
        cache_root or settings.PEERMEM_CACHE.text() or Path.home() / ".cache" / "commlayer" / "peermem"
    )
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    digest = hashlib.sha256(source + arch.encode() + suffix.encode()).hexdigest()[:16]
    return root / f"peermem-{arch}-{digest}{suffix}"


def find_nvcc() -> str | None:
    """The nvcc to build with: $CUDA_HOME/bin/nvcc, else the one on PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None
    )


def _build(target: Path, arch: str) -> None:
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("peermem: nvcc was not found (set CUDA_HOME) to build the peer-memory kernels")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    command = [nvcc, "-O3", f"-arch={arch}", "--fmad=false", "-Xcompiler", "-fPIC", "-shared"]
    command += ["-cudart", "shared", f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o", str(partial)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"peermem: building the kernels failed ({' '.join(command)}):\n{result.stderr}")
    os.replace(partial, target)


class KernelLibrary:
    """The C entry points, with their argument types declared once."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        vp, ull, i = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_int
        lib.pm_create.argtypes = [i, i, i, ull, ull, ctypes.POINTER(vp), ctypes.c_char_p]
        lib.pm_open.argtypes = [vp, i, ctypes.c_char_p]
        lib.pm_launch.argtypes = [vp, i, vp, vp, ull, i, vp, i, i, ull, ull, i]
        lib.pm_segment.argtypes = [vp, ctypes.POINTER(ull)]
        lib.pm_export.argtypes = [vp, ctypes.c_char_p]
        lib.pm_import.argtypes = [vp, i, i, ctypes.c_char_p]
        lib.pm_set_place.argtypes = [vp, i, i, i, ull, ull]
        lib.pm_error.argtypes = [vp, ctypes.POINTER(i), ctypes.POINTER(i)]
        lib.pm_error_string.restype = ctypes.c_char_p
        lib.pm_destroy.argtypes = [vp]
        lib.pm_error_address.argtypes = [vp]
        lib.pm_error_address.restype = vp
        self.lib = lib
        self.handle_bytes = lib.pm_handle_bytes()
        self.max_slots = lib.pm_max_slots()
        self.max_descs = lib.pm_max_descs()
        # The same file imported as a module: its launch() skips ctypes' argument conversions.
        loader = importlib.machinery.ExtensionFileLoader("_peermem_kernels", str(path))
        module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(module)
        self.launch = module.launch
        self.all_to_all = module.all_to_all
        self.fused_norm = module.fused_norm
        self.segment = module.segment
        self.record = module.record
        self.wait = module.wait

    def error_string(self, code: int) -> str:
        return self.lib.pm_error_string(code).decode()


@functools.cache
def load_library(arch: str) -> KernelLibrary:
    """The kernels built for ``arch``, building them first when no cached build exists."""
    target = cache_path(source_bytes(), arch)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                _build(target, arch)
    return KernelLibrary(target)
