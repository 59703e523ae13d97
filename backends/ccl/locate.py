"""Find a oneCCL installation: headers for the build, shared libraries for the run.

Standard library only: setup.py loads this file by path before commlayer is importable, and the
benchmark build script reuses it, so the build and the runtime agree on where oneCCL lives.

Search order (first match wins)::

    $CCL_ROOT                        an oneAPI install or `source setvars.sh`
    $ONEAPI_ROOT/ccl/latest          oneAPI toolkit layout
    sys.prefix, sys.base_prefix      the oneccl-cpu(-devel) PyPI wheels install here
    the oneccl-cpu(-devel) files     wherever pip put them (--user, --prefix)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = ["OneCclInstall", "candidate_prefixes", "find_oneccl"]

_HEADER = Path("include", "oneapi", "ccl.hpp")
_LIBRARY_NAMES = ("libccl.so.1", "libccl.so")
_WHEELS = ("oneccl-cpu-devel", "oneccl-cpu")


@dataclass(frozen=True)
class OneCclInstall:
    """One oneCCL prefix; ``include_dir`` is None when only the runtime (no devel wheel) is there."""

    prefix: Path
    lib_dir: Path
    include_dir: Path | None

    @property
    def library(self) -> Path:
        return next(self.lib_dir / name for name in _LIBRARY_NAMES if (self.lib_dir / name).exists())

    @property
    def libfabric_dir(self) -> Path:
        """libfabric ships with impi-rt (a dependency of oneccl-cpu) under lib/libfabric."""
        return self.lib_dir / "libfabric"

    @property
    def libfabric_provider_dir(self) -> Path:
        return self.libfabric_dir / "prov"


def candidate_prefixes(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Every prefix worth checking, most specific first, without duplicates."""
    environ = os.environ if environ is None else environ
    found: list[Path] = []
    if environ.get("CCL_ROOT"):
        found.append(Path(environ["CCL_ROOT"]))
    if environ.get("ONEAPI_ROOT"):
        found.append(Path(environ["ONEAPI_ROOT"], "ccl", "latest"))
    found += [Path(sys.prefix), Path(sys.base_prefix)]
    found += list(_wheel_prefixes())
    unique: list[Path] = []
    for prefix in found:
        if prefix not in unique:
            unique.append(prefix)
    return unique


def find_oneccl(require_headers: bool, environ: Mapping[str, str] | None = None) -> OneCclInstall | None:
    """The first prefix holding libccl (and ccl.hpp when ``require_headers``), else None."""
    for prefix in candidate_prefixes(environ):
        install = _inspect(prefix)
        if install is not None and (install.include_dir is not None or not require_headers):
            return install
    return None


def _inspect(prefix: Path) -> OneCclInstall | None:
    lib_dir = prefix / "lib"
    if not any((lib_dir / name).exists() for name in _LIBRARY_NAMES):
        return None
    include_dir = prefix / "include" if (prefix / _HEADER).exists() else None
    return OneCclInstall(prefix=prefix, lib_dir=lib_dir, include_dir=include_dir)


def _wheel_prefixes() -> Iterable[Path]:
    # The wheels record libccl.so as "../../libccl.so" relative to site-packages; the prefix is
    # the directory above the one holding it.
    for wheel in _WHEELS:
        try:
            files = metadata.files(wheel) or []
        except metadata.PackageNotFoundError:
            continue
        for record in files:
            if record.name in _LIBRARY_NAMES:
                yield Path(os.path.normpath(record.locate())).parent.parent
