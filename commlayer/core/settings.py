"""Every ``COMMLAYER_*`` environment variable: its name, type, default and meaning, read here only.

Each variable is one :class:`Setting`; code reads it through :meth:`Setting.value` (typed) or
:meth:`Setting.text` (the raw string, for values that need their caller's context to check), so
no other module reads ``os.environ`` for a ``COMMLAYER_*`` name. The configuration page is
generated from :data:`SETTINGS`::

    python -m commlayer.core.settings --markdown          # the table, as docs/guides/configuration.md has it
    python -m commlayer.core.settings --write PAGE        # rewrite PAGE below its generated-section marker

setup.py reads ``COMMLAYER_BUILD_CCL`` itself, since it runs before the package is importable.
``tests/project/test_settings.py`` fails when the source names a variable not declared here, or
when the page's table differs from this module.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AREAS", "GENERATED_MARKER", "SETTINGS", "Setting", "by_name", "markdown_table"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
Value = str | int | float | bool | None


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``name``, its ``kind`` (str, int, float or bool), the ``default``
    used when it is unset or empty, a one-line ``meaning``, and the ``area`` of the page it is
    listed under. ``choices`` lists a str variable's accepted values (compared lower-case)."""

    name: str
    kind: type
    default: Value
    meaning: str
    area: str
    choices: tuple[str, ...] = ()

    def text(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's stripped value, or None when it is unset or empty.

        Args:
            environ: where to read it (default ``os.environ``).
        """
        raw = (os.environ if environ is None else environ).get(self.name, "").strip()
        return raw or None

    def required(self, environ: Mapping[str, str] | None = None) -> str:
        """The variable's stripped value, for one its reader cannot run without.

        Raises:
            KeyError: it is unset or empty.
        """
        raw = self.text(environ)
        if raw is None:
            raise KeyError(f"${self.name} must be set: {self.meaning}")
        return raw

    def value(self, environ: Mapping[str, str] | None = None) -> Value:
        """The variable parsed as its ``kind``, or ``default`` when it is unset or empty.

        Args:
            environ: where to read it (default ``os.environ``).

        Raises:
            ValueError: the value does not parse as ``kind`` or is not one of ``choices``.
        """
        raw = self.text(environ)
        if raw is None:
            return self.default
        if self.kind is bool:
            return self._parse_bool(raw)
        if self.kind in (int, float):
            return self._parse_number(raw)
        if self.choices:
            return self._parse_choice(raw)
        return raw

    def _parse_bool(self, raw: str) -> bool:
        lowered = raw.lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise self._invalid(f"one of {_TRUE + _FALSE}", raw)

    def _parse_number(self, raw: str) -> int | float:
        try:
            return self.kind(raw)
        except ValueError:
            raise self._invalid(f"a{'n integer' if self.kind is int else ' number'}", raw) from None

    def _parse_choice(self, raw: str) -> str:
        lowered = raw.lower()
        if lowered not in self.choices:
            raise self._invalid(f"one of {self.choices}", raw)
        return lowered

    def _invalid(self, expected: str, raw: str) -> ValueError:
        return ValueError(f"${self.name} expected {expected}, received {raw!r}")


# The page's sections, in order: each area's heading and the sentence that opens it.
AREAS = {
    "backends": ("Backends", "Which backend runs, and how the built-in ones behave."),
    "mpi": ("The mpi backend", "Its mode and what it hands to the MPI library."),
    "peermem": ("The peermem backend", "commlayer's own intra-host GPU collectives, the CUDA default."),
    "network": ("Network", "Which network interface the ranks use."),
    "reliability": ("Reliability", "Checks before communicating, and failure detection."),
    "observability": ("Observability", "The flight recorder, its dumps and the comms logger."),
    "launch": ("Launching", "`commlayer run` across hosts, and the test harness's mpirun."),
    "internal": ("Internal", "Set by commlayer for its own child processes; not meant to be set by hand."),
    "build": ("Build", "Read by setup.py when the package is built."),
}

BACKEND = Setting(
    "COMMLAYER_BACKEND",
    str,
    None,
    "backend for `init_process_group()` without one (default by accelerator)",
    "backends",
)
C_FAST_PATHS = Setting(
    "COMMLAYER_C_FAST_PATHS",
    bool,
    True,
    "let new plans use the built C fast paths; 0 keeps the Python ones",
    "backends",
)
BRIDGE_FUTURES = Setting(
    "COMMLAYER_BRIDGE_FUTURES",
    str,
    "auto",
    "how the torch bridge completes futures: background thread, inline, or auto by spare CPUs",
    "backends",
    ("auto", "background", "inline"),
)
TORCH_TAKEOVER = Setting(
    "COMMLAYER_TORCH_TAKEOVER",
    bool,
    False,
    "1: torch groups asked for as gloo, nccl or no backend are commlayer's (unmodified framework scripts)",
    "backends",
)
HOST_ID = Setting(
    "COMMLAYER_HOST_ID",
    str,
    None,
    "host identity for shm (ranks with different ids never share memory)",
    "backends",
)
CACHE_DIR = Setting(
    "COMMLAYER_CACHE_DIR",
    str,
    None,
    "where builds made at first use are cached (ccl's binding); default $XDG_CACHE_HOME/commlayer",
    "backends",
)
PEERMEM = Setting(
    "COMMLAYER_PEERMEM", bool, True, "0 sends every call of the peermem backend to NCCL", "peermem"
)
PEERMEM_BYTES = Setting(
    "COMMLAYER_PEERMEM_BYTES",
    int,
    32 << 20,
    "staging bytes per call; each rank maps two such halves per group",
    "peermem",
)
PEERMEM_ALGORITHM = Setting(
    "COMMLAYER_PEERMEM_ALGORITHM",
    str,
    None,
    "force one algorithm wherever the kernels fit (benchmarks); default: the crossover table",
    "peermem",
    ("one_shot", "one_shot_push", "two_shot", "push", "zero_copy", "nccl"),
)
PEERMEM_ASYNC_BYTES = Setting(
    "COMMLAYER_PEERMEM_ASYNC_BYTES",
    int,
    1 << 20,
    "async_op=True calls of at least this many bytes issued from the default stream run on a "
    "stream of the group's own, beside the caller's compute; the others, and every call when "
    "negative, on the caller's stream",
    "peermem",
)
PEERMEM_CACHE = Setting(
    "COMMLAYER_PEERMEM_CACHE",
    str,
    None,
    "where the kernels' nvcc build is kept; default ~/.cache/commlayer/peermem",
    "peermem",
)
MPI_MODE = Setting(
    "COMMLAYER_MPI_MODE",
    str,
    None,
    "mpi's mode when no MpiOptions are given (default ordered; blocking with COMMLAYER_MPI_BLOCKING_SYNC)",
    "mpi",
    ("ordered", "requests", "blocking"),
)
MPI_BLOCKING_SYNC = Setting(
    "COMMLAYER_MPI_BLOCKING_SYNC", bool, False, "with no mode set, pick mpi's blocking mode", "mpi"
)
MPI_CUDA_AWARE = Setting(
    "COMMLAYER_MPI_CUDA_AWARE",
    bool,
    None,
    "whether device pointers go to MPI (default: ask the library)",
    "mpi",
)
SOCKET_IFNAME = Setting(
    "COMMLAYER_SOCKET_IFNAME",
    str,
    None,
    "the network interface every backend uses (default: the route to MASTER_ADDR)",
    "network",
)
DEBUG = Setting(
    "COMMLAYER_DEBUG",
    str,
    None,
    "`detail` checks every collective's arguments across the group before it runs",
    "reliability",
)
FULL_TRACEBACK = Setting(
    "COMMLAYER_FULL_TRACEBACK",
    bool,
    False,
    "keep commlayer's own frames (and a raw library error's chain) in the traceback of its errors",
    "reliability",
)
GLOO_VERIFY = Setting(
    "COMMLAYER_GLOO_VERIFY",
    bool,
    True,
    "gloo checks each collective's signature across ranks before communicating",
    "reliability",
)
CCL_VERIFY = Setting(
    "COMMLAYER_CCL_VERIFY",
    bool,
    True,
    "ccl checks each collective's signature across ranks before communicating",
    "reliability",
)
MPI_VERIFY = Setting(
    "COMMLAYER_MPI_VERIFY",
    bool,
    True,
    "mpi checks each collective's signature across ranks before communicating",
    "reliability",
)
HEARTBEAT_INTERVAL = Setting(
    "COMMLAYER_HEARTBEAT_INTERVAL",
    float,
    0.5,
    "seconds between peer-monitor heartbeats; 0 turns the monitor off",
    "reliability",
)
HEARTBEAT_MISSES = Setting(
    "COMMLAYER_HEARTBEAT_MISSES",
    int,
    10,
    "missed heartbeats that make a rank dead (at least 2)",
    "reliability",
)
FLIGHT_RECORDER_SIZE = Setting(
    "COMMLAYER_FLIGHT_RECORDER_SIZE",
    int,
    2000,
    "entries the flight recorder keeps per process (at least 1)",
    "observability",
)
TRACE_DIR = Setting(
    "COMMLAYER_TRACE_DIR",
    str,
    None,
    "where flight-recorder dumps go (default <tmp>/commlayer-trace)",
    "observability",
)
JOB_ID = Setting(
    "COMMLAYER_JOB_ID",
    str,
    None,
    "the job's id, naming its dump and log folders; `commlayer run` sets it (else the launcher's own id)",
    "observability",
)
KEEP_JOBS = Setting(
    "COMMLAYER_KEEP_JOBS",
    int,
    10,
    "job folders kept in the trace folder and in `commlayer run`'s log folder; older ones are removed "
    "when a job writes its first file there (0 keeps all)",
    "observability",
)
COMMS_LOGGER = Setting(
    "COMMLAYER_COMMS_LOGGER",
    bool,
    False,
    "enable the comms logger at init; rank 0 prints its table at exit",
    "observability",
)
COMMS_LOGGER_OPS = Setting(
    "COMMLAYER_COMMS_LOGGER_OPS",
    str,
    None,
    "comma-separated ops the comms logger records (default all)",
    "observability",
)
COMMS_LOGGER_VERBOSE = Setting(
    "COMMLAYER_COMMS_LOGGER_VERBOSE",
    bool,
    False,
    "the comms logger prints every call as it completes",
    "observability",
)
COMMS_LOGGER_TRACE = Setting(
    "COMMLAYER_COMMS_LOGGER_TRACE",
    str,
    None,
    "Chrome trace file the comms logger writes at exit (`{rank}` is replaced)",
    "observability",
)
SSH = Setting(
    "COMMLAYER_SSH",
    str,
    "ssh",
    "remote shell for `commlayer run --hostfile` (ssh, pdsh and mpirun launchers)",
    "launch",
)
MPIRUN = Setting(
    "COMMLAYER_MPIRUN",
    str,
    None,
    "the mpirun to use (default: mpirun beside the interpreter, then on PATH)",
    "launch",
)
MPI = Setting(
    "COMMLAYER_MPI",
    str,
    None,
    "which MPI the test harness's mpirun worlds use: openmpi, intel-mpi or mpich",
    "launch",
)
FT_STORE = Setting(
    "COMMLAYER_FT_STORE",
    str,
    None,
    "HOST:PORT of the store `commlayer run --ft` hosts for a fault-tolerant job's members",
    "internal",
)
FT_SLOT_RESTART = Setting(
    "COMMLAYER_FT_SLOT_RESTART",
    int,
    0,
    "how many times `commlayer run --ft` restarted this member in its slot",
    "internal",
)
FT_CHANNEL = Setting(
    "COMMLAYER_FT_CHANNEL",
    int,
    None,
    "file descriptor on which a fault-tolerant member tells its slot keeper how it ended",
    "internal",
)
TESTING_RESULTS_DIR = Setting(
    "COMMLAYER_TESTING_RESULTS_DIR",
    str,
    None,
    "folder where run_world's ranks write their results",
    "internal",
)
TESTING_FORK_SERVER = Setting(
    "COMMLAYER_TESTING_FORK_SERVER",
    bool,
    True,
    "run_world forks local ranks from a server that has imported torch (0: start each afresh)",
    "launch",
)
TESTING_SUPERVISED_PID = Setting(
    "COMMLAYER_TESTING_SUPERVISED_PID",
    int,
    None,
    "pid run_world supervises for a rank the fork server started (its stand-in process)",
    "internal",
)
BENCH_PROGRESS_EVERY = Setting(
    "COMMLAYER_BENCH_PROGRESS_EVERY",
    float,
    10.0,
    "seconds between `commlayer bench`'s progress lines when its output is not a terminal",
    "observability",
)
LINE_BUFFERED = Setting(
    "COMMLAYER_LINE_BUFFERED",
    bool,
    False,
    "set by `commlayer run` for ranks under mpirun: from init on, stdout and stderr write whole lines "
    "(mpirun labels each write)",
    "internal",
)
BENCH_OPTIONS = Setting(
    "COMMLAYER_BENCH_OPTIONS", str, None, "`commlayer bench` options, as JSON, for its ranks", "internal"
)
BENCH_RESULT = Setting(
    "COMMLAYER_BENCH_RESULT", str, None, "file where `commlayer bench`'s rank 0 writes the sweep", "internal"
)
BENCH_PROGRESS = Setting(
    "COMMLAYER_BENCH_PROGRESS",
    str,
    None,
    "file where `commlayer bench`'s rank 0 writes its progress",
    "internal",
)
BUILD_CCL = Setting(
    "COMMLAYER_BUILD_CCL",
    str,
    "auto",
    "build the oneCCL extension: 1 requires it, 0 skips it, auto builds it where it can",
    "build",
    ("0", "1", "auto"),
)

# Every setting above, in the page's order.
SETTINGS: tuple[Setting, ...] = tuple(v for v in tuple(globals().values()) if isinstance(v, Setting))
_BY_NAME = {setting.name: setting for setting in SETTINGS}
GENERATED_MARKER = "<!-- generated section below -->"


def by_name(name: str) -> Setting:
    """The declared setting called ``name``.

    Raises:
        KeyError: ``name`` is not declared here.
    """
    return _BY_NAME[name]


def markdown_table() -> str:
    """The configuration page's generated section: one table per area, every setting once."""
    lines = []
    for area, (heading, sentence) in AREAS.items():
        lines += [f"### {heading}", "", sentence, "", "| Variable | Type | Default | Meaning |"]
        lines.append("|---|---|---|---|")
        for setting in (s for s in SETTINGS if s.area == area):
            lines.append(
                f"| `{setting.name}` | {_type_cell(setting)} | {_default_cell(setting)} | {setting.meaning} |"
            )
        lines.append("")
    return "\n".join(lines)


def _type_cell(setting: Setting) -> str:
    if setting.choices:
        return " \\| ".join(f"`{choice}`" for choice in setting.choices)
    return setting.kind.__name__


def _default_cell(setting: Setting) -> str:
    if setting.default is None:
        return "unset"
    if setting.kind is bool:
        return "`1`" if setting.default else "`0`"
    return f"`{setting.default}`"


def write_page(page: Path) -> None:
    """Replace everything below ``page``'s generated-section marker with :func:`markdown_table`."""
    head, marker, _ = page.read_text().partition(GENERATED_MARKER)
    if not marker:
        raise ValueError(f"{page}: expected the line {GENERATED_MARKER!r}, found none")
    page.write_text(f"{head}{GENERATED_MARKER}\n\n{markdown_table()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m commlayer.core.settings", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--markdown", action="store_true", help="print the configuration table")
    parser.add_argument("--write", type=Path, metavar="PAGE", help="rewrite PAGE below its marker")
    args = parser.parse_args(argv)
    if args.write:
        write_page(args.write)
    else:
        sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
