"""The logger itself: the facade observer, its records and the public functions (see the package doc)."""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from commlayer.comms_logger.records import TraceEvent, _Accumulator, _Records
from commlayer.comms_logger.summary import chrome_trace, combine_ranks, format_summary
from commlayer.comms_logger.timer import timed_plan
from commlayer.contract.fast_paths import FastPath
from commlayer.core import settings
from commlayer.core.metrics import OP_FAMILY, busbw_factor, format_size
from commlayer.core.work import Work
from commlayer.facade.calls import dispatch
from commlayer.facade.calls.dispatch import observed

__all__ = [
    "ENV_ENABLE",
    "ENV_OPS",
    "ENV_TRACE",
    "ENV_VERBOSE",
    "CommsLogger",
    "LoggerOptions",
    "TraceEvent",
    "disable",
    "enable",
    "enable_from_environment",
    "export_chrome_trace",
    "is_enabled",
    "on_init_process_group",
    "reset",
    "stats",
    "summary",
]

ENV_ENABLE = settings.COMMS_LOGGER.name
ENV_OPS = settings.COMMS_LOGGER_OPS.name
ENV_VERBOSE = settings.COMMS_LOGGER_VERBOSE.name
ENV_TRACE = settings.COMMS_LOGGER_TRACE.name
_ACCELERATORS = ("cuda", "xpu", "npu", "hpu")


@dataclass(frozen=True)
class LoggerOptions:
    """``ops``: facade op names or bench families ("all_gather" also logs all_gather_into_tensor)."""

    ops: frozenset[str] | None = None  # None: every op
    verbose: bool = False  # one line per op on stderr
    max_trace_events: int = 100_000  # most recent ops kept for export_chrome_trace

    def wants(self, op: str) -> bool:
        return self.ops is None or op in self.ops or OP_FAMILY.get(op, op) in self.ops


class CommsLogger:
    """The observer the facade calls; one instance per :func:`enable`."""

    def __init__(self, options: LoggerOptions, records: _Records) -> None:
        self.options = options
        self.records = records
        self._muted_thread: int | None = None  # summary()'s own traffic is not logged

    def observe(self, call: dispatch.OpCall, nbytes: int, start: Callable[[], Work], **details: Any) -> Work:
        if self.options.ops is not None and not self.options.wants(call.op):
            return start()
        if self._muted_thread is not None and threading.get_ident() == self._muted_thread:
            return start()
        accelerators = _accelerators_of(call.backend)
        _synchronize(accelerators)
        wall_ns, began = time.time_ns(), time.perf_counter()

        def finished() -> None:
            _synchronize(accelerators)
            self._record(call, nbytes, wall_ns, time.perf_counter() - began)

        return start().then(finished)

    def wrap_plan(
        self, call: dispatch.OpCall, run: FastPath, payload: int, fixed: tuple[Any, ...] = ()
    ) -> FastPath:
        """The per-plan hook (see ``observers.Observer``): a blocking op on CPU tensors
        costs two clock reads and one append; everything else takes :meth:`observe`'s path."""
        if not self.options.wants(call.op):
            return run
        observed_run = observed(self, call, run, payload)
        if self.options.verbose or (call.device_type != "cpu" and _candidates(call.backend)):
            return observed_run  # an accelerator's ops are timed between device synchronisations
        label = (call.op, call.backend.name, call.group.name, call.group.size(), call.group.global_rank)
        return timed_plan(
            run, observed_run, self, label, self.records, self.options.max_trace_events, payload
        )

    def _record(self, call: dispatch.OpCall, nbytes: int, wall_ns: int, seconds: float) -> None:
        if self.records.pending:  # keep events in the order the ops started
            self.records.drain(self.options.max_trace_events)
        size = call.group.size()
        event = TraceEvent(
            call.op, nbytes, wall_ns / 1e3, seconds * 1e6, call.backend.name, call.group.name, size
        )
        records = self.records
        with records.lock:
            records.rank = call.group.global_rank
            records._accumulator(call.op, nbytes).add(seconds, nbytes * busbw_factor(call.op, size))
            if self.options.max_trace_events > 0:
                if len(records.events) >= self.options.max_trace_events:
                    records.events.popleft()
                    records.dropped_events += 1
                records.events.append(event)
        if self.options.verbose:
            _print_event(records.rank, event)


_records = _Records()
_active: CommsLogger | None = None
_last: CommsLogger | None = None  # the latest enabled logger, which left any pending entries


# --- public API --------------------------------------------------------------------------------


def enable(ops: Iterable[str] | None = None, verbose: bool = False, max_trace_events: int = 100_000) -> None:
    """Start logging (again); records made so far are kept (see :func:`reset`)."""
    global _active, _last
    chosen = None if ops is None else frozenset(_op_names(ops))
    _drain_pending()
    _records.wall_offset = time.time() - time.perf_counter()
    _active = _last = CommsLogger(LoggerOptions(chosen, bool(verbose), int(max_trace_events)), _records)
    dispatch.set_observer(_active)


def disable() -> None:
    """Stop logging: the facade goes back to its observer-free path. Records are kept."""
    global _active
    _drain_pending()
    _active = None
    dispatch.set_observer(None)


def is_enabled() -> bool:
    return _active is not None


def reset() -> None:
    """Forget every record and trace event."""
    _records.pending.clear()
    if _records.log is not None:
        _records.log.clear()
    with _records.lock:
        _records.totals.clear()
        _records.events.clear()
        _records.dropped_events = 0


def stats() -> dict[str, dict[int, dict[str, Any]]]:
    """This rank's records: ``{op: {S: {count, total_bytes, latency_us{avg,min,max}, algbw_gbps, busbw_gbps}}}``."""
    _drain_pending()
    with _records.lock:
        snapshot = {key: _local_row(key, value) for key, value in sorted(_records.totals.items())}
    nested: dict[str, dict[int, dict[str, Any]]] = {}
    for (op, nbytes), row in snapshot.items():
        nested.setdefault(op, {})[nbytes] = row
    return nested


def summary(group: Any = None, print_rank: int | None = 0, file: TextIO | None = None) -> dict[str, Any]:
    """Every rank's records side by side; a collective over ``group`` when the world is up.

    Returns ``{"world_size": n, "ops": {op: {S: row}}}`` on every rank, where ``row`` holds
    ``count`` (per rank; ``count_min``/``count_max`` differ if ranks disagree), ``total_bytes``,
    ``avg_us_min``/``avg_us_max`` (lowest and highest per-rank mean latency) with their ranks
    ``fastest_rank``/``slowest_rank``, ``min_us``/``max_us`` over every call of every rank, and
    ``algbw_gbps``/``busbw_gbps`` from the highest per-rank mean. Global rank ``print_rank``
    prints it as a table (None: nobody prints).
    """
    per_rank = _gather(_rank_snapshot(), group)
    combined = combine_ranks(per_rank)
    if print_rank is not None and _global_rank() == print_rank:
        print(format_summary(combined), file=file or sys.stdout, flush=True)
    return combined


def export_chrome_trace(path: str | Path, group: Any = None) -> Path | None:
    """Write the ops as a Chrome / Perfetto trace, one process row per rank.

    With the world up this is a collective over ``group``: every rank's events go to the group's
    first rank, which writes ``path`` and returns it (other ranks return None). Before init, or
    after destroy, it writes this rank's events only. ``{rank}`` in ``path`` is replaced.
    """
    with _records.lock:
        local = (_records.rank, *_records.trace(_trace_max_events()))
    gathered = _gather(local, group)
    if gathered is None or not _is_first_rank(group):
        return None
    target = Path(str(path).replace("{rank}", str(_global_rank())))
    target.write_text(json.dumps(chrome_trace(gathered)), encoding="utf-8")
    return target


# --- helpers -------------------------------------------------------------------------------------


def _op_names(ops: Iterable[str]) -> list[str]:
    if isinstance(ops, str):
        return [name.strip() for name in ops.split(",") if name.strip()]
    return [str(name) for name in ops]


def _local_row(key: tuple[str, int], value: _Accumulator) -> dict[str, Any]:
    _, nbytes = key
    mean_s = value.total_s / value.count
    return {
        "count": value.count,
        "total_bytes": value.count * nbytes,
        "latency_us": {"avg": mean_s * 1e6, "min": value.min_s * 1e6, "max": value.max_s * 1e6},
        "algbw_gbps": value.count * nbytes / value.total_s / 1e9 if value.total_s > 0 else 0.0,
        "busbw_gbps": value.bus_bytes / value.total_s / 1e9 if value.total_s > 0 else 0.0,
    }


def _drain_pending() -> None:
    """Fold the plan wrappers' pending entries into totals and events (whoever enabled them)."""
    if _records.has_unfolded() and _last is not None:
        _records.drain(_last.options.max_trace_events)


def _trace_max_events() -> int:
    return _last.options.max_trace_events if _last is not None else LoggerOptions.max_trace_events


def _rank_snapshot() -> dict[str, Any]:
    _drain_pending()
    with _records.lock:
        totals = {f"{op}\t{nbytes}": vars(value).copy() for (op, nbytes), value in _records.totals.items()}
    return {"rank": _global_rank(), "totals": totals}


def _gather(payload: Any, group: Any) -> list[Any] | None:
    """Every rank's ``payload`` on every rank (a list of one before init); muted while it runs."""
    from commlayer import dist

    if not dist.is_initialized() or dist.get_world_size(group) <= 1:
        return [payload]
    if dist.get_rank(group) < 0:
        return None  # not a member of ``group``
    logger = _active
    if logger is not None:
        logger._muted_thread = threading.get_ident()
    try:
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, payload, group=group)
    finally:
        if logger is not None:
            logger._muted_thread = None
    return gathered


def _is_first_rank(group: Any) -> bool:
    from commlayer import dist

    return not dist.is_initialized() or dist.get_rank(group) == 0


def _global_rank() -> int:
    from commlayer import dist

    return dist.get_rank() if dist.is_initialized() else _records.rank


_candidates_by_class: dict[type, tuple[Any, ...]] = {}


def _candidates(backend: Any) -> tuple[Any, ...]:
    """The torch device modules ``backend`` may run on (once per backend class)."""
    candidates = _candidates_by_class.get(type(backend))
    if candidates is None:
        modules = [
            getattr(torch, kind, None) for kind in _ACCELERATORS if kind in backend.capabilities.devices
        ]
        candidates = tuple(module for module in modules if hasattr(module, "is_initialized"))
        _candidates_by_class[type(backend)] = candidates
    return candidates


def _accelerators_of(backend: Any) -> tuple[Any, ...]:
    """The torch device modules to synchronise for ops on ``backend`` (initialised ones only)."""
    candidates = _candidates(backend)
    return tuple(module for module in candidates if module.is_initialized()) if candidates else ()


def _synchronize(modules: tuple[Any, ...]) -> None:
    for module in modules:
        module.synchronize()


def _print_event(rank: int, event: TraceEvent) -> None:
    seconds = event.duration_us / 1e6
    algbw = event.nbytes / seconds / 1e9 if seconds > 0 else 0.0
    busbw = algbw * busbw_factor(event.op, event.group_size)
    print(
        f"[comms rank {rank}] {event.op} {format_size(event.nbytes)}B {event.duration_us:.1f} us "
        f"algbw {algbw:.3f} GB/s busbw {busbw:.3f} GB/s ({event.backend}, group {event.group} of {event.group_size})",
        file=sys.stderr,
        flush=True,
    )


def enable_from_environment(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """COMMLAYER_COMMS_LOGGER=1 enables at import; at exit rank 0 prints its own table."""
    if not settings.COMMS_LOGGER.value(environ):
        return False
    enable(
        ops=settings.COMMS_LOGGER_OPS.text(environ),
        verbose=bool(settings.COMMS_LOGGER_VERBOSE.value(environ)),
    )
    atexit.register(_report_at_exit, settings.COMMS_LOGGER_TRACE.text(environ))
    return True


def on_init_process_group() -> None:
    """The facade's extension hook (see ``commlayer.facade.lifecycle.extensions``): enable from the environment."""
    if not is_enabled():
        enable_from_environment()


def _report_at_exit(trace_path: str | None) -> None:
    """Local only: at exit the other ranks may be gone, so no collective is attempted."""
    _drain_pending()
    with _records.lock:
        rank = _records.rank
        events = (rank, *_records.trace(_trace_max_events()))
    if trace_path:
        target = Path(
            trace_path.replace("{rank}", str(rank)) if "{rank}" in trace_path else f"{trace_path}.rank{rank}"
        )
        target.write_text(json.dumps(chrome_trace([events])), encoding="utf-8")
    if rank == 0 and _records.totals:
        table = format_summary(combine_ranks([_rank_snapshot()]))
        print(
            f"{table}\n(rank 0 only: call dist.comms_logger.summary() for every rank)",
            file=sys.stderr,
            flush=True,
        )
