"""Build the oneCCL binding on first use, where the installed commlayer has no prebuilt one.

``pip install 'commlayer[ccl]'`` brings oneCCL's headers (oneccl-cpu-devel) and pybind11 but
builds no C++ against them: pip builds commlayer in isolation, before the extras are installed.
The first world of the ccl backend therefore compiles ``binding.cpp`` with the system's C++
compiler (``$CXX``, else ``c++``), as DeepSpeed's op builders do, into a cache folder keyed by
everything the result depends on, and every later run loads it from there::

    $COMMLAYER_CACHE_DIR, else $XDG_CACHE_HOME/commlayer, else ~/.cache/commlayer
        ccl/<key>/_C.cpython-311-x86_64-linux-gnu.so

Ranks that start together take one file lock, so only one of them compiles.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from commlayer.backends.ccl.locate import OneCclInstall
from commlayer.core import settings

__all__ = [
    "CACHE_ENV",
    "BuildPlan",
    "BuildUnavailable",
    "build_plan",
    "built_extension",
    "cache_root",
    "cached_extension",
]

CACHE_ENV = settings.CACHE_DIR.name
_SOURCE_NAME = "binding.cpp"
# A wheel carries the source as package data; a checkout (or an editable install) has it in csrc/.
_SOURCE_PLACES = (
    Path(__file__).resolve().parent / "_csrc" / _SOURCE_NAME,
    Path(__file__).resolve().parents[2] / "csrc" / "ccl" / _SOURCE_NAME,
)
_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-fvisibility=hidden")
_STDERR_TAIL = 3000  # characters of the compiler's complaint kept in the error


class BuildUnavailable(ImportError):
    """The binding cannot be built here: the message says what is missing."""


@dataclass(frozen=True)
class BuildPlan:
    """Everything one build needs; ``key`` names its cache folder."""

    source: Path
    compiler: str
    include_dirs: tuple[str, ...]
    install: OneCclInstall
    versions: str  # of oneCCL, pybind11 and Python: a new one of any gets its own build

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.source.read_bytes())
        for part in (*self.compile_flags, *self.link_flags, self.compiler, self.versions):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()[:16]

    @property
    def compile_flags(self) -> tuple[str, ...]:
        return (*_FLAGS, *(f"-I{folder}" for folder in self.include_dirs))

    @property
    def link_flags(self) -> tuple[str, ...]:
        lib_dir = str(self.install.lib_dir)
        # rpath: the binding finds libccl without LD_LIBRARY_PATH, as the prebuilt one does.
        return (f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}", "-lccl")

    @property
    def cache_folder(self) -> Path:
        return cache_root() / "ccl" / self.key

    @property
    def target(self) -> Path:
        return self.cache_folder / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}"

    def command(self, output: Path) -> list[str]:
        return [self.compiler, *self.compile_flags, str(self.source), *self.link_flags, "-o", str(output)]


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The folder that holds commlayer's built binding (see the module docstring)."""
    configured = settings.CACHE_DIR.text(environ)
    if configured is not None:
        return Path(configured)
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "commlayer"


def build_plan(install: OneCclInstall | None) -> BuildPlan:
    """How the binding would be built here, or BuildUnavailable saying what is missing."""
    if install is None:
        raise BuildUnavailable("oneCCL is not installed")
    if install.include_dir is None:
        raise BuildUnavailable(f"oneCCL at {install.prefix} has no headers (oneccl-cpu-devel)")
    source = next((place for place in _SOURCE_PLACES if place.is_file()), None)
    if source is None:
        raise BuildUnavailable(f"the binding's source ({_SOURCE_NAME}) is not part of this installation")
    try:
        import pybind11
    except ImportError as error:
        raise BuildUnavailable("pybind11 is not installed") from error
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        raise BuildUnavailable(f"no C++ compiler ({os.environ.get('CXX', 'c++')}) on PATH")
    includes = (pybind11.get_include(), sysconfig.get_paths()["include"], str(install.include_dir))
    versions = f"{_oneccl_version()} pybind11=={pybind11.__version__} python=={sys.version}"
    return BuildPlan(source, compiler, includes, install, versions)


def cached_extension(plan: BuildPlan) -> Path | None:
    """The binding an earlier run built for ``plan``, or None."""
    return plan.target if plan.target.is_file() else None


def built_extension(plan: BuildPlan) -> Path:
    """The cached binding of ``plan``, compiled first if no earlier run did (under a file lock)."""
    target = plan.target
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not target.is_file():  # another rank may have built it while this one waited
            _compile(plan, target)
    return target


def _compile(plan: BuildPlan, target: Path) -> None:
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    print(f"commlayer: compiling the oneCCL binding once, into {target.parent}", file=sys.stderr, flush=True)
    command = plan.command(partial)
    finished = subprocess.run(command, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildUnavailable(
            f"compiling the oneCCL binding failed (exit code {finished.returncode}): {' '.join(command)}\n"
            f"{finished.stderr[-_STDERR_TAIL:]}"
        )
    os.replace(partial, target)  # atomic: a reader sees no file or the whole one


def _oneccl_version() -> str:
    for wheel in ("oneccl-cpu-devel", "oneccl-cpu"):
        try:
            return f"{wheel}=={metadata.version(wheel)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"
