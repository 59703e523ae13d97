"""The per-rank sweep: every backend, op and size, timed and (with ``--check``) verified.

Every rank runs :func:`run_sweep`; rank 0 gets the records. The world is initialised once on gloo
as a *control plane* (aligning ranks, gathering times and skip decisions), and each benchmarked
backend gets its own group, ``dist.new_group(backend=name)``, over every rank. Why not init and
destroy the default group once per backend instead:

* one rendezvous serves every backend; re-initialising would need a fresh store per backend,
  which torchrun's agent-hosted store and MPI (no re-init after finalize) do not allow;
* a backend that fails to start, or computes wrong results, cannot disturb the timing and
  agreement traffic, which never runs on it.

Example, 2 ranks, ``--backends gloo,ccl``: the default group is gloo (control); ``group_gloo``
and ``group_ccl`` both span ranks [0, 1]; all_reduce on ``group_ccl`` is timed, then its time
and wrong count travel to rank 0 over the default group.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from commlayer import dist
from commlayer.bench.cases import FACADE_OPS, CaseContext, Layout, check_values_exact, layout, make_case
from commlayer.bench.options import BenchOptions
from commlayer.bench.raw import RAW_BACKENDS, MemcpyCalls, RawMpiCalls
from commlayer.bench.records import BenchRecord, SweepResult
from commlayer.contract.registry import get_backend_class
from commlayer.core.metrics import algbw_gbps, busbw_factor
from commlayer.core.rendezvous import discover

__all__ = ["RowReporter", "StepReporter", "count_steps", "run_sweep"]

CONTROL_BACKEND = "gloo"
_ACCELERATORS = ("cuda", "xpu", "npu", "hpu")

#: Called on rank 0 after each measured (or skipped) step: (steps done, label).
StepReporter = Callable[[int, str], None]
#: Called on rank 0 with each record the moment it is measured, and its backend's device.
RowReporter = Callable[[BenchRecord, str], None]


@dataclass(frozen=True)
class _Plan:
    """The sizes each op runs at, shared by the sweep and the progress total."""

    options: BenchOptions

    def sizes(self, op: str) -> list[int]:
        if op == "barrier":
            return [0]
        return self.options.sizes


def count_steps(options: BenchOptions) -> int:
    plan = _Plan(options)
    return len(options.backends) * sum(len(plan.sizes(op)) for op in options.ops)


def run_sweep(
    options: BenchOptions, report_step: StepReporter | None = None, report_row: RowReporter | None = None
) -> SweepResult | None:
    """Initialise the control world, run every backend in turn, tear everything down.

    Returns the result on rank 0 and None on every other rank.
    """
    dist.init_process_group(CONTROL_BACKEND, timeout=timedelta(seconds=options.timeout_s))
    try:
        check_values_exact(options.torch_dtype, dist.get_world_size())  # results are always verified
        return _Sweep(options, report_step, report_row).run()
    finally:
        dist.destroy_process_group()


class _Sweep:
    def __init__(
        self, options: BenchOptions, report_step: StepReporter | None, report_row: RowReporter | None
    ) -> None:
        self.options = options
        self.plan = _Plan(options)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.report_step = report_step if self.rank == 0 else None
        self.report_row = report_row if self.rank == 0 else None
        self.steps_done = 0
        self.records: list[BenchRecord] = []
        self.notes: list[str] = []
        self.devices: list[tuple[str, str]] = []

    def run(self) -> SweepResult | None:
        self._note_pinning()
        if self.options.interleave:
            self._run_interleaved()
        else:
            self._run_in_turn()
        if self.rank != 0:
            return None
        return SweepResult(tuple(self.records), tuple(self.notes), self.world_size, tuple(self.devices))

    def _run_in_turn(self) -> None:
        """Every op and size of one backend, then the next backend's."""
        for backend in self.options.backends:
            opened = self._open_for_sweep(backend)
            if opened is None:
                continue
            group, device = opened
            try:
                for op in self.options.ops:
                    self._run_op(op, [(backend, group, device)])
            finally:
                _close(group)

    def _run_interleaved(self) -> None:
        """Every backend open at once; at each size, repeat r of every backend runs before any
        backend's repeat r + 1, so a machine whose speed drifts charges the drift to all alike."""
        opened: list[tuple[str, Any, torch.device]] = []
        try:
            for backend in self.options.backends:
                usable = self._open_for_sweep(backend)
                if usable is not None:
                    opened.append((backend, *usable))
            for op in self.options.ops:
                self._run_op(op, opened)
        finally:
            for _, group, _ in opened:
                _close(group)

    def _open_for_sweep(self, backend: str) -> tuple[Any, torch.device] | None:
        """:meth:`_open`, recording the backend's device; None (its steps skipped) if it failed."""
        group, device = self._open(backend)
        if group is None or device is None:
            self._skip_steps(backend, self.options.ops)
            return None
        self.devices.append((backend, str(device)))
        return group, device

    def _note_pinning(self) -> None:
        """Say so when a launcher pinned this rank: helper threads (gloo's) then share its cores."""
        allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        cores = os.cpu_count() or 1
        if allowed is not None and allowed < cores:
            self.notes.append(
                f"rank {self.rank} is pinned to {allowed} of {cores} cores (launcher binding); backends that "
                "progress on helper threads (gloo) slow down most: compare with binding off too "
                "(Open MPI: --bind-to none, Intel MPI: I_MPI_PIN=0)"
            )

    # --- one backend -----------------------------------------------------------------------

    def _open(self, backend: str) -> tuple[Any, torch.device | None]:
        """A group on ``backend`` over every rank, or None (with a note) if any rank failed."""
        group, device, failure = None, None, ""
        try:
            if backend in RAW_BACKENDS:
                device, group = torch.device("cpu"), RawMpiCalls() if backend == "mpi4py" else MemcpyCalls()
            else:
                device = _device_for(backend, self.options.device)
                group = dist.new_group(backend=backend, timeout=timedelta(seconds=self.options.timeout_s))
        except Exception as error:  # noqa: BLE001 - reported as a skip, agreed by every rank
            failure = f"{type(error).__name__}: {error}"
        failures = [""] * self.world_size
        dist.all_gather_object(failures, failure)
        reason = next((text for text in failures if text), None)
        if reason is None:
            return group, device
        if group is not None:
            _close(group)
        failed_ranks = [rank for rank, text in enumerate(failures) if text]
        self.notes.append(f"{backend}: skipped (failed to start on ranks {failed_ranks}): {reason}")
        return None, None

    def _run_op(self, op: str, opened: list[tuple[str, Any, torch.device]]) -> None:
        """One op on each open backend, side by side. A lone backend's rows are reported as they
        are measured; side by side they wait for the op's end, so each backend's table stays whole."""
        runnable: list[tuple[str, CaseContext, torch.device]] = []
        for backend, group, device in opened:
            reason = self._unsupported(backend, op, device)
            if reason is None:
                runnable.append((backend, self._context(backend, group, device), device))
            else:
                self.notes.append(f"{backend} {op}: skipped: {reason}")
                self._skip_steps(backend, (op,))
        measured: set[int] = set()
        rows: dict[str, list[tuple[Any, ...]]] = {backend: [] for backend, _, _ in runnable}
        for requested in self.plan.sizes(op):
            shape = layout(op, requested, self.options.torch_dtype, self.world_size)
            if shape.nbytes not in measured:  # rounding to whole chunks can repeat a size
                measured.add(shape.nbytes)
                for backend, times_us, wrong in self._measure_side_by_side(runnable, shape):
                    rows[backend].append((backend, shape.op, shape.nbytes, shape.count, times_us, wrong))
            if len(runnable) == 1:
                self._record_all(rows)
            for backend, _, _ in runnable:
                self._advance(f"{backend} {op} {requested}B")
        self._record_all(rows)

    def _record_all(self, rows: dict[str, list[tuple[Any, ...]]]) -> None:
        """Record the pending rows, backend by backend, and forget them."""
        for backend_rows in rows.values():
            for row in backend_rows:
                self._record(*row)
            backend_rows.clear()

    def _measure_side_by_side(
        self, runnable: list[tuple[str, CaseContext, torch.device]], shape: Layout
    ) -> list[tuple[str, list[float], int]]:
        """Every backend's (times, wrong) at one size, their repeats taking turns."""
        cases = [(backend, make_case(context, shape), device) for backend, context, device in runnable]
        for _, case, device in cases:
            self._warm_up(case, device)
        timed: dict[str, list[tuple[float, int]]] = {backend: [] for backend, _, _ in cases}
        for _ in range(self.options.repeats):
            for backend, case, device in cases:
                timed[backend].append(self._time_repeat(case, device))
        results = []
        for backend, case, device in cases:
            wrong = self._wrong(case, device, timed[backend])
            if hasattr(case, "close"):
                case.close()  # a window case frees its window (collective)
            results.append((backend, [time_us for time_us, _ in timed[backend]], wrong))
        return results

    def _context(self, backend: str, group: Any, device: torch.device) -> CaseContext:
        if backend in RAW_BACKENDS:  # the reference's own calls, not the facade's
            return CaseContext(None, self.rank, self.world_size, device, self.options.torch_dtype, api=group)
        return CaseContext(group, self.rank, self.world_size, device, self.options.torch_dtype)

    def _unsupported(self, backend: str, op: str, device: torch.device) -> str | None:
        if backend in RAW_BACKENDS:
            return None
        capabilities = get_backend_class(backend).capabilities
        missing = [name for name in FACADE_OPS[op] if name not in capabilities.ops]
        if missing:
            return f"backend does not support {', '.join(missing)}"
        if op != "barrier" and self.options.torch_dtype not in capabilities.dtypes:
            return f"backend does not support dtype {self.options.dtype}"
        if op == "pingpong" and self.world_size < 2:
            return "pingpong needs at least 2 ranks"
        if device.type not in capabilities.devices:
            return f"backend does not run on {device.type}"
        return None

    # --- one size --------------------------------------------------------------------------

    def _warm_up(self, case: Any, device: torch.device) -> None:
        case.fill(0)
        for _ in range(self.options.warmup):
            _finish(case.run_op(self.options.async_op))
        _synchronize(device)

    def _time_repeat(self, case: Any, device: torch.device) -> tuple[float, int]:
        """One repeat's mean us per op, and its wrong elements (counted with --check only)."""
        if self.options.check:
            return self._measure_checked(case, device)
        return self._time_iterations(case, device), 0

    def _wrong(self, case: Any, device: torch.device, timed: list[tuple[float, int]]) -> int:
        if self.options.check:
            return sum(wrong for _, wrong in timed)
        return self._verify_once(case, device)

    def _time_iterations(self, case: Any, device: torch.device) -> float:
        """Mean us per op over ``iters`` calls that every rank starts together."""
        options = self.options
        dist.barrier()
        # The control barrier releases ranks up to a gloo round trip apart (up to ~1 ms): charged
        # to the first timed op, that was ~10 us per op over 100 iterations. One untimed op on the
        # measured backend itself lines the ranks up to within that backend's own latency.
        _finish(case.run_op(options.async_op))
        _synchronize(device)
        start = time.perf_counter()
        if options.async_op:
            works = [case.run_op(True) for _ in range(options.iters)]
            for work in works:
                _finish(work)
        else:
            for _ in range(options.iters):
                case.run_op(False)
        _synchronize(device)
        return (time.perf_counter() - start) / options.iters * 1e6

    def _verify_once(self, case: Any, device: torch.device) -> int:
        """Without --check, one untimed run on fresh values still proves the results right."""
        iteration = self.options.iters  # values no timed iteration used
        case.fill(iteration)
        _finish(case.run_op(self.options.async_op))
        _synchronize(device)
        return case.wrong(iteration)

    def _measure_checked(self, case: Any, device: torch.device) -> tuple[float, int]:
        """Refill, time and verify each iteration on its own; only the op itself is timed."""
        elapsed, wrong = 0.0, 0
        for iteration in range(self.options.iters):
            case.fill(iteration)
            _synchronize(device)
            dist.barrier()  # ranks start together, so nobody's fill or verify is timed
            start = time.perf_counter()
            _finish(case.run_op(self.options.async_op))
            _synchronize(device)
            elapsed += time.perf_counter() - start
            wrong += case.wrong(iteration)
        return elapsed / self.options.iters * 1e6, wrong

    def _record(
        self, backend: str, op: str, nbytes: int, count: int, times_us: list[float], wrong: int
    ) -> None:
        """Gather every rank's (times, wrong) over the control group; rank 0 keeps the record.

        A repeat lasts as long as its slowest rank; the record keeps the best repeat.
        """
        local = torch.tensor([*times_us, float(wrong)], dtype=torch.float64)
        gathered = torch.empty(local.numel() * self.world_size, dtype=torch.float64)
        dist.all_gather_into_tensor(gathered, local)
        if self.rank != 0:
            return
        per_rank = gathered.view(self.world_size, local.numel())
        slowest_us = float(per_rank[:, :-1].max(dim=0).values.min())
        algbw = algbw_gbps(nbytes, slowest_us / 1e6)
        self.records.append(
            BenchRecord(
                backend=backend,
                op=op,
                bytes=nbytes,
                count=count,
                dtype=self.options.dtype,
                world_size=self.world_size,
                time_us=slowest_us,
                algbw_gbps=algbw,
                # A copy moves S bytes whatever op its row is in: its bandwidth is S / t.
                busbw_gbps=algbw * (1.0 if backend == "memcpy" else busbw_factor(op, self.world_size)),
                wrong=int(per_rank[:, -1].sum()),
            )
        )
        if self.report_row is not None:
            self.report_row(self.records[-1], dict(self.devices).get(backend, "?"))

    def _skip_steps(self, backend: str, ops: Any) -> None:
        for op in ops:
            for _ in self.plan.sizes(op):
                self._advance(f"{backend} {op} skipped")

    def _advance(self, label: str) -> None:
        self.steps_done += 1
        if self.report_step is not None:
            self.report_step(self.steps_done, label)


# --- devices -----------------------------------------------------------------------------


def _device_for(backend: str, requested: str) -> torch.device:
    """``--device``, or (auto) the first accelerator the backend serves and this host has."""
    local_rank = _local_rank()
    if requested != "auto":
        kind = torch.device(requested).type
        return torch.device(kind) if kind == "cpu" else _accelerator(kind, local_rank)
    devices = get_backend_class(backend).capabilities.devices
    for kind in _ACCELERATORS:
        module = getattr(torch, kind, None)
        if kind in devices and module is not None and module.is_available():
            return _accelerator(kind, local_rank)
    return torch.device("cpu")


def _accelerator(kind: str, local_rank: int) -> torch.device:
    module = getattr(torch, kind)
    index = local_rank % max(1, module.device_count())
    module.set_device(index)
    return torch.device(kind, index)


def _local_rank() -> int:
    found = discover(os.environ)
    return 0 if found is None else found.local_rank


def _close(group: Any) -> None:
    """Destroy a benchmarked group, or release a reference's communicator."""
    if isinstance(group, (RawMpiCalls, MemcpyCalls)):
        group.close()
        return
    dist.destroy_process_group(group)


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        getattr(torch, device.type).synchronize(device)


def _finish(work: Any) -> None:
    if work is not None:
        work.wait()
