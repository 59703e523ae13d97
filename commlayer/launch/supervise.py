"""Run processes, copy their output with a prefix, and stop all of them on the first failure.

:func:`supervise` knows nothing about ranks: ``commlayer run`` gives it local ranks
(:mod:`.local`), the ssh/pdsh/mpirun/srun process of each host (:mod:`.multinode`), the agent on
a host gives it that host's ranks (:mod:`.agent`), and the test harness gives it a single mpirun.
Each process runs in its own process group so that a stop reaches the whole tree it spawned, and
it is killed if the supervising thread dies (Linux PR_SET_PDEATHSIG), so nothing outlives a
killed test run. SIGINT and SIGTERM are forwarded to every process and stop the world; SIGUSR1
is forwarded only (the ranks dump their flight recorders). A process whose spec sets ``stdin_signals`` (an ssh to a remote agent) gets
forwarded signals as a line on its stdin instead, since a signal would only kill the ssh client.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol, TextIO

from commlayer.core.metrics import format_duration
from commlayer.core.processes import _descendants, _signal_pids, pid_running
from commlayer.launch.tracebacks import TracebackHold, strip_torch_prefix

__all__ = [
    "TIMEOUT_EXIT_CODE",
    "LaunchResult",
    "LineRouter",
    "ProcessOutcome",
    "ProcessSpec",
    "SuperviseOptions",
    "child_setup",
    "describe_exit",
    "pid_running",
    "shell_code",
    "supervise",
]

TIMEOUT_EXIT_CODE = 124  # what coreutils' timeout(1) returns
_POLL_SECONDS = 0.05
_DRAIN_SECONDS = 2.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class SuperviseOptions:
    timeout: float | None = None  # seconds before every process is stopped
    echo: bool = True  # copy output to this process's stdout/stderr with a [rankN] prefix
    log_dir: Path | None = None  # one rankN.log (label without spaces) per process
    forward_signals: bool = True  # SIGINT/SIGTERM reach every process (main thread only)
    kill_grace: float = 3.0  # seconds between SIGTERM and SIGKILL when stopping
    tail_lines: int = 40  # output lines kept per process for LaunchResult
    # Polled while the processes run; a returned reason stops all of them (e.g. a rank of an
    # mpirun job wrote a traceback but mpirun itself keeps waiting for the other ranks).
    stop_check: Callable[[], str | None] | None = None
    # After the first failure, keep watching this long for others to fail by themselves before
    # stopping the rest (ranks on several hosts fail together; the caller picks the root cause);
    # with hold_tracebacks, no longer than until each has printed its exception.
    settle: float = 0.0
    # Hold each process's stderr from its first Python traceback on, for the caller to show
    # (ProcessOutcome.held and .exception); echoed output then stays one screen long.
    hold_tracebacks: bool = False
    # (index, exit code) -> True for a failure that stops nothing (a lost host of a job whose
    # members survive each other); the others run on and the process counts as ended.
    tolerated: Callable[[int, int], bool] | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(
                f"SuperviseOptions: argument 'timeout' expected a positive number of seconds or None, received {self.timeout}"
            )
        if not self.kill_grace >= 0:
            raise ValueError(
                f"SuperviseOptions: argument 'kill_grace' expected a non-negative number of seconds, received {self.kill_grace}"
            )


class LineRouter(Protocol):
    """Takes over a process's output lines (one mpirun's, carrying many ranks' lines): returns
    what to echo, already labelled. Called from the stdout and stderr reader threads."""

    def feed(self, line: str, stderr: bool) -> list[str]: ...

    def flush(self, stderr: bool) -> list[str]: ...


@dataclass(frozen=True)
class ProcessSpec:
    label: str  # e.g. "rank 1": used in summaries; "[rank1]" prefixes output, "rank1.log" is its log
    argv: tuple[str, ...]
    env: Mapping[str, str]
    tag: str | None = None  # output prefix; None: "[label without spaces] ", "": none
    stdin_signals: bool = False  # forwarded signals arrive as "SIGINT\n" lines on a kept-open stdin
    router: LineRouter | None = None  # echoes in place of the tag and hold (still logged as label)


@dataclass(frozen=True)
class ProcessOutcome:
    label: str
    exit_code: int  # negative: killed by that signal number (the subprocess convention)
    stopped: bool  # still running when the supervisor stopped the world
    output_tail: tuple[str, ...]  # last lines of stdout and stderr, interleaved as they came
    held: tuple[str, ...] = ()  # stderr from its first traceback on, not echoed (hold_tracebacks)
    exception: str | None = None  # "ValueError: text": the last exception its tracebacks named


@dataclass(frozen=True)
class LaunchResult:
    outcomes: tuple[ProcessOutcome, ...]
    first_failure: int | None = None  # index of the first process that exited non-zero by itself
    timed_out: bool = False
    signal_received: int | None = None
    stop_reason: str | None = None  # what SuperviseOptions.stop_check returned
    timeout: float | None = None  # the limit that applied, for the summary
    ended_at: float | None = None  # time.time() when the first failure, timeout or signal was seen

    @property
    def exit_code(self) -> int:
        """The failed rank's code (128+N for a signal death, as shells report), 124 on timeout."""
        if self.first_failure is not None:
            return shell_code(self.outcomes[self.first_failure].exit_code)
        if self.signal_received is not None:
            return 128 + self.signal_received
        if self.timed_out:
            return TIMEOUT_EXIT_CODE
        return 1 if self.stop_reason is not None else 0

    @property
    def stopped_labels(self) -> list[str]:
        return [outcome.label for outcome in self.outcomes if outcome.stopped]

    def summary(self, prefix: str = "commlayer run") -> str | None:
        """One line for the user, or None when every process succeeded."""
        stopped = self.stopped_labels
        if self.first_failure is not None:
            failed = self.outcomes[self.first_failure]
            others = f"{len(stopped) or 'no'} other rank" + ("" if len(stopped) <= 1 else "s")
            raised = f" raised {failed.exception} and" if failed.exception else ""
            return f"{prefix}: {failed.label}{raised} {describe_exit(failed.exit_code)}; stopped {others}"
        if self.signal_received is not None:
            name = signal.Signals(self.signal_received).name
            killed = f"; killed {_listing(stopped)} (still running after the grace period)" if stopped else ""
            return f"{prefix}: received {name} and forwarded it to every process{killed}"
        if self.timed_out:
            after = "" if self.timeout is None else f" after {format_duration(self.timeout)}"
            return f"{prefix}: timed out{after}; stopped {_listing(stopped)} (still running)"
        if self.stop_reason is not None:
            return f"{prefix}: {self.stop_reason}; stopped {_listing(stopped)}"
        return None


def supervise(specs: Sequence[ProcessSpec], options: SuperviseOptions) -> LaunchResult:
    """Run every spec, stop all of them on the first non-zero exit, timeout, signal or stop_check."""
    echo_lock = threading.Lock()
    running: list[_Running] = []
    try:
        # Signals are forwarded from before the first spawn: a rank may announce itself before the
        # handlers would otherwise be set, and a signal sent then must not end the launcher.
        with _forwarded_signals(running, options.forward_signals) as received:
            for index, spec in enumerate(specs):
                running.append(_Running(index, spec, options))
            # Reader threads start only after every fork, so no child is forked while they hold locks.
            for process in running:
                process.start_threads(echo_lock if options.echo else None)
            ending = _watch(running, options, received)
        ended_at = time.time()
    finally:
        stopped = _stop(running, options.kill_grace)
        for process in running:
            process.finish()
    return LaunchResult(
        outcomes=tuple(process.outcome(process.index in stopped) for process in running),
        first_failure=ending.first_failure,
        timed_out=ending.timed_out,
        signal_received=ending.signal_received,
        stop_reason=ending.stop_reason,
        timeout=options.timeout,
        ended_at=ended_at,
    )


@dataclass(frozen=True)
class _Ending:
    first_failure: int | None = None
    timed_out: bool = False
    signal_received: int | None = None
    stop_reason: str | None = None


def _watch(running: list[_Running], options: SuperviseOptions, received: list[int]) -> _Ending:
    exits: queue.Queue[tuple[int, int]] = queue.Queue()
    for process in running:
        process.report_exit_to(exits)
    deadline = None if options.timeout is None else time.monotonic() + options.timeout
    signal_deadline: float | None = None
    failure: int | None = None
    settled = 0.0
    remaining = len(running)
    while remaining:
        if failure is not None and (time.monotonic() >= settled or _all_reported(running)):
            break
        if received:
            # Give the ranks the grace period to act on the forwarded signal (e.g. checkpoint).
            signal_deadline = signal_deadline or time.monotonic() + options.kill_grace
            if time.monotonic() >= signal_deadline:
                break
        elif failure is None and options.stop_check is not None and (reason := options.stop_check()):
            return _Ending(stop_reason=reason)
        if failure is None and deadline is not None and time.monotonic() >= deadline:
            return _Ending(timed_out=True)
        try:
            index, code = exits.get(timeout=_POLL_SECONDS)
        except queue.Empty:
            continue
        remaining -= 1
        tolerated = options.tolerated is not None and options.tolerated(index, code)
        if code != 0 and not received and failure is None and not tolerated:
            failure, settled = index, time.monotonic() + options.settle
    if failure is not None:
        return _Ending(first_failure=failure)
    return _Ending(signal_received=received[0] if received else None)


def _all_reported(running: list[_Running]) -> bool:
    """Every process has exited or printed the exception it is exiting with (held tracebacks)."""
    return all(not process.alive() or process.raised() for process in running)


@contextlib.contextmanager
def _forwarded_signals(running: list[_Running], enabled: bool) -> Iterator[list[int]]:
    received: list[int] = []
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield received
        return

    def forward(signum: int, _frame: object) -> None:
        if signum != signal.SIGUSR1:  # SIGUSR1 asks the ranks for a flight-recorder dump, no stop
            received.append(signum)
        for process in running:
            process.forward(signum)

    previous = {
        signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    }
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop(running: list[_Running], grace: float) -> set[int]:
    """SIGTERM every live process group, SIGKILL what is left after ``grace``; return who was live."""
    alive = [process for process in running if process.alive()]
    if not alive:
        return set()
    # Descendants that left the process group (mpirun's ranks do) are found through /proc.
    strays = {pid for process in alive for pid in _descendants(process.pid)}
    for process in alive:
        process.signal_group(signal.SIGTERM)
    _signal_pids(strays, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(process.alive() for process in alive) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    for process in alive:
        process.signal_group(signal.SIGKILL)
    _signal_pids(strays, signal.SIGKILL)
    return {process.index for process in alive}


class _Running:
    """One spawned process and the threads that copy its output and wait for its exit."""

    def __init__(self, index: int, spec: ProcessSpec, options: SuperviseOptions) -> None:
        self.index = index
        self.spec = spec
        self.tag = "[" + spec.label.replace(" ", "") + "] " if spec.tag is None else spec.tag
        self.tail: deque[str] = deque(maxlen=max(options.tail_lines, 1))
        self.threads: list[threading.Thread] = []
        self.log = _open_log(options.log_dir, spec.label)
        self.log_lock = threading.Lock()
        self.hold = TracebackHold() if options.hold_tracebacks else None
        try:
            self.popen = subprocess.Popen(
                spec.argv,
                env=dict(spec.env),
                stdin=subprocess.PIPE if spec.stdin_signals else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=_CHILD_SETUP,  # noqa: PLW1509 - PR_SET_PDEATHSIG has no Popen equivalent
            )
        except BaseException:
            if self.log is not None:
                self.log.close()
            raise
        self.pid = self.popen.pid

    def start_threads(self, echo_lock: threading.Lock | None) -> None:
        for pipe, sink, hold in (
            (self.popen.stdout, sys.stdout, None),
            (self.popen.stderr, sys.stderr, self.hold),
        ):
            self._spawn_thread(self._copy, pipe, sink if echo_lock else None, echo_lock, hold)

    def report_exit_to(self, exits: queue.Queue[tuple[int, int]]) -> None:
        self._spawn_thread(lambda: exits.put((self.index, self.popen.wait())))

    def _spawn_thread(self, target: Callable[..., None], *args: object) -> None:
        # Daemon threads: a grandchild that keeps a pipe open must not keep this process alive.
        thread = threading.Thread(target=target, args=args, name=f"commlayer-{self.tag.strip()}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def _copy(
        self,
        pipe: IO[bytes],
        sink: TextIO | None,
        echo_lock: threading.Lock | None,
        hold: TracebackHold | None,
    ) -> None:
        router, stderr = self.spec.router, pipe is self.popen.stderr
        for raw in iter(pipe.readline, b""):
            line = strip_torch_prefix(raw.decode("utf-8", errors="replace").rstrip("\n"))
            self.tail.append(line)
            if self.log is not None:
                with self.log_lock:
                    self.log.write(line + "\n")
            if router is not None:
                self._echo(router.feed(line, stderr), sink, echo_lock)
            else:
                self._echo(hold.feed(line) if hold is not None else [line], sink, echo_lock)
        if router is not None:
            self._echo(router.flush(stderr), sink, echo_lock)
        elif hold is not None:
            self._echo(hold.flush(), sink, echo_lock)

    def _echo(self, lines: list[str], sink: TextIO | None, echo_lock: threading.Lock | None) -> None:
        if lines and sink is not None and echo_lock is not None:
            with echo_lock:
                sink.write("".join(self.tag + line + "\n" for line in lines))
                sink.flush()

    def raised(self) -> bool:
        return self.hold is not None and self.hold.exception is not None

    def alive(self) -> bool:
        return self.popen.returncode is None and pid_running(self.pid)

    def forward(self, signum: int) -> None:
        """A signal the supervisor received, passed on (as a line, for a remote agent's ssh)."""
        if not self.spec.stdin_signals:
            self.signal_group(signum)
            return
        with contextlib.suppress(OSError, ValueError):  # already gone: the stop handles it
            self.popen.stdin.write(signal.Signals(signum).name.encode() + b"\n")
            self.popen.stdin.flush()

    def signal_group(self, signum: int) -> None:
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)

    def finish(self) -> None:
        """Reap the process and let the readers drain, but never wait on a pipe held by a stray."""
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        deadline = time.monotonic() + _DRAIN_SECONDS
        for thread in self.threads:
            thread.join(timeout=max(deadline - time.monotonic(), 0))
        if self.log is not None:
            with self.log_lock:
                self.log.close()

    def outcome(self, stopped: bool) -> ProcessOutcome:
        code = self.popen.returncode
        held = () if self.hold is None else tuple(self.hold.lines)
        exception = None if self.hold is None else self.hold.exception
        return ProcessOutcome(
            self.spec.label,
            -signal.SIGKILL if code is None else code,
            stopped,
            tuple(self.tail),
            held,
            exception,
        )


def _open_log(log_dir: Path | None, label: str) -> TextIO | None:
    if log_dir is None:
        return None
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    return open(Path(log_dir) / (label.replace(" ", "") + ".log"), "w", encoding="utf-8")


def child_setup(own_group: bool = True) -> Callable[[], None]:
    """What a child runs between fork and exec: its own process group (``own_group``) and death
    with the thread that started it."""
    prctl = None
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            prctl = ctypes.CDLL(None, use_errno=True).prctl

    def setup() -> None:
        if own_group:
            os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))

    return setup


_CHILD_SETUP = child_setup()


def shell_code(code: int) -> int:
    """A Popen returncode as a shell reports it: 128+N for a death by signal N."""
    return 128 - code if code < 0 else code


def describe_exit(code: int) -> str:
    """``was killed by SIGKILL (exit code 137)`` or ``exited with code 3``, from a Popen returncode."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name} (exit code {128 - code})"
    return f"exited with code {code}"


def _listing(labels: list[str]) -> str:
    if len(labels) > 3:  # a summary stays one short line however many ranks stopped
        return f"{labels[0]}, {labels[1]} and {len(labels) - 2} others"
    return ", ".join(labels) if labels else "nothing"
