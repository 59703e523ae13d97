"""Build script: metadata lives in pyproject.toml; this file adds what it cannot express."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

from setuptools import Extension, find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# The oneCCL extension: "auto" (default) builds it when oneCCL is found and skips it with a note
# otherwise (the ccl backend then compiles it on first use); "1" (CI) makes a missing oneCCL a
# build error; "0" never builds it.
BUILD_CCL_ENV = "COMMLAYER_BUILD_CCL"
CCL_SOURCE = Path("csrc", "ccl", "binding.cpp")


def _packages() -> list[str]:
    # backends/ installs as commlayer.backends (see package-dir in pyproject.toml).
    core = find_packages(include=["commlayer", "commlayer.*"])
    plugins = [
        "commlayer.backends" + name[len("backends") :]
        for name in find_packages(include=["backends", "backends.*"])
    ]
    return core + plugins


def _load_by_path(relative: str) -> ModuleType:
    # commlayer is not importable while it is being built, so load the one stdlib-only helper.
    spec = importlib.util.spec_from_file_location("_commlayer_build_helper", ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _skip(reason: str, required: bool) -> list[Extension]:
    if required:
        sys.exit(f"commlayer: {BUILD_CCL_ENV}=1 but the oneCCL extension cannot be built: {reason}")
    print(
        f"commlayer: NOTE: not prebuilding the optional oneCCL extension ({reason}); the 'ccl' backend "
        "compiles it on first use where oneCCL's headers, pybind11 and a C++ compiler are installed "
        "(pip install 'commlayer[ccl]').",
        file=sys.stderr,
    )
    return []


# Sources the backends compile on first use, shipped inside their packages: source -> package folder.
FIRST_USE_SOURCES = {
    CCL_SOURCE: Path("commlayer", "backends", "ccl"),
    **{
        path.relative_to(ROOT): Path("commlayer", "backends", "peermem")
        for path in sorted((ROOT / "csrc" / "peermem").iterdir())
        if path.suffix in (".cu", ".cuh", ".h")
    },
}


class BuildPyWithFirstUseSources(build_py):
    """Also ships the sources the ccl and peermem backends build on first use (in ``_csrc/``)."""

    def run(self) -> None:
        super().run()
        for source, package in FIRST_USE_SOURCES.items():
            target = Path(self.build_lib, package, "_csrc", source.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / source, target)


def ccl_extensions(mode: str | None = None) -> list[Extension]:
    """The oneCCL binding commlayer.backends.ccl._C, or nothing when oneCCL is not installed."""
    mode = (mode or os.environ.get(BUILD_CCL_ENV, "auto")).strip().lower()
    if mode == "0":
        return _skip(f"{BUILD_CCL_ENV}=0", required=False)
    required = mode == "1"
    try:
        import pybind11
    except ImportError:
        return _skip("pybind11 is not installed in the build environment", required)
    install = _load_by_path("backends/ccl/locate.py").find_oneccl(require_headers=True)
    if install is None:
        return _skip("oneCCL headers/libraries not found (CCL_ROOT, ONEAPI_ROOT, sys.prefix)", required)
    print(f"commlayer: building the oneCCL extension against {install.prefix}", file=sys.stderr)
    extension = Extension(
        "commlayer.backends.ccl._C",
        sources=[str(CCL_SOURCE)],
        include_dirs=[pybind11.get_include(), str(install.include_dir)],
        library_dirs=[str(install.lib_dir)],
        libraries=["ccl"],
        # rpath: the extension finds libccl without LD_LIBRARY_PATH.
        runtime_library_dirs=[str(install.lib_dir)],
        extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden"],
        language="c++",
        # Not optional: once oneCCL is found a compile error must fail the install loudly, or a
        # stale _C from an earlier build would keep running.
    )
    return [extension]


def _shm_extensions() -> list[Extension]:
    """The shared-memory backend's commlayer.backends.shm._C: needs only a C++17 compiler and pybind11."""
    import pybind11  # a build requirement (pyproject.toml), so a plain pip install always has it

    sources = [
        "binding.cpp",
        "comm.cpp",
        "copy.cpp",
        "kernels.cpp",
        "fast_paths.cpp",
        "placement.cpp",
        "segment.cpp",
        "window_copies.cpp",
    ]
    return [
        Extension(
            "commlayer.backends.shm._C",
            sources=[f"csrc/shm/{name}" for name in sources],
            depends=["csrc/common/recording.hpp", "csrc/common/spin.hpp", "csrc/common/tensor_meta.h"],
            include_dirs=[pybind11.get_include()],
            libraries=["rt"],
            # -O3 vectorises the reduction kernels; kernels.cpp compiles them per ISA and picks one
            # at run time, so no -march flag ties the build to the build machine.
            extra_compile_args=["-std=c++17", "-O3", "-fvisibility=hidden"],
            language="c++",
        )
    ]


def _mpi_fast_path_extensions() -> list[Extension]:
    """The mpi backend's C fast paths commlayer.backends.mpi._fast_paths: pybind11 and the Python C API,
    no MPI headers (the MPI library is found at run time), so every build has it."""
    import pybind11

    return [
        Extension(
            "commlayer.backends.mpi._fast_paths",
            sources=["csrc/mpi/fast_paths.cpp"],
            include_dirs=[pybind11.get_include()],
            depends=[
                "csrc/common/recording.hpp",
                "csrc/common/spin.hpp",
                "csrc/mpi/mpi_abi.hpp",
                "csrc/mpi/shared_slots.hpp",
            ],
            extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden"],
            language="c++",
        )
    ]


def _python_api_extensions() -> list[Extension]:
    """The fast paths built on the Python C API alone (no torch or pybind11 headers), so one build
    serves every torch version, one extension per layer: the facade's plan lookups and p2p entries
    (commlayer.facade.calls._fast_paths), the torch backends' fast paths
    (commlayer.backends._torch_fast_paths), peermem's (commlayer.backends.peermem._fast_paths,
    which reaches its CUDA kernels through an address) and the comms logger's timer
    (commlayer.comms_logger._fast_paths)."""
    common = ["csrc/common/python_module.h", "csrc/common/tensor_meta.h"]
    layers = {
        "commlayer.facade.calls._fast_paths": (
            "facade_fast_paths",
            ("module", "one_tensor", "paired", "p2p_entries"),
        ),
        "commlayer.backends._torch_fast_paths": ("torch_fast_paths", ("module", "fast_paths", "work")),
        "commlayer.backends.peermem._fast_paths": ("peermem_fast_paths", ("module", "kernel_path")),
        "commlayer.comms_logger._fast_paths": ("logger_fast_paths", ("module", "timed", "timed_log")),
    }
    return [
        Extension(
            name,
            sources=[f"csrc/{folder}/{source}.c" for source in sources],
            depends=[*common, *(str(header) for header in Path("csrc", folder).glob("*.h"))],
            extra_compile_args=["-O2", "-fvisibility=hidden"],
        )
        for name, (folder, sources) in layers.items()
    ]


def _tensor_meta_extensions() -> list[Extension]:
    """The C fast paths' tensor reader commlayer.core._tensor_meta, compiled against the headers of
    the torch found in the build environment (so only where the build runs without isolation after
    torch is installed, as .ci/setup does); skipped with a note otherwise, the launchers then ask
    tensors' Python attributes. The module records the torch version it was built for, and is used
    only under that version (commlayer/core/tensor_reader.py)."""
    try:
        import torch
        from torch.utils.cpp_extension import include_paths
    except ImportError:
        print("commlayer: NOTE: torch is not importable while building: no C tensor reader", file=sys.stderr)
        return []
    library_dir = str(Path(torch.__file__).parent / "lib")
    return [
        Extension(
            "commlayer.core._tensor_meta",
            sources=["csrc/tensor_meta/reader.cpp"],
            depends=["csrc/common/tensor_meta.h"],
            include_dirs=include_paths(),
            library_dirs=[library_dir],
            libraries=["torch_python", "torch_cpu", "c10"],
            define_macros=[
                ("COMMLAYER_TORCH_VERSION", f'"{torch.__version__}"'),
                ("_GLIBCXX_USE_CXX11_ABI", str(int(torch._C._GLIBCXX_USE_CXX11_ABI))),
            ],
            extra_compile_args=["-std=c++20", "-O2", "-fvisibility=hidden"],
            language="c++",
        )
    ]


if __name__ == "__main__":
    setup(
        packages=_packages(),
        cmdclass={"build_py": BuildPyWithFirstUseSources},
        ext_modules=_shm_extensions()
        + _mpi_fast_path_extensions()
        + _python_api_extensions()
        + _tensor_meta_extensions()
        + ccl_extensions(),
    )
