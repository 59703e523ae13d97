"""The Manager: one member's view of a fault-tolerant data-parallel job.

Per step: every collective is started async and waited here, polling the store for the step's
outcome and the generation's peers' liveness, so a death or a hang abandons the step in
milliseconds instead of at a timeout (a backend whose ops run in the calling thread, like shm,
is interrupted by the watchdog thread through :mod:`commlayer.core.health`). The step then commits
through the store: the last member to finish writes the outcome with ``compare_set``, and an
aborting member writes "abort" the same way, so every member sees the same outcome. After an
abort, or when standby members complete a replica, the members run a new quorum
(:mod:`.quorum_rounds`), build the next generation's communicators or keep those whose members
are unchanged (:mod:`.communicators`), and the members lacking the newest state receive it from
a healthy peer over the backend. A member its peers drop as hung leaves (exit code
:data:`FENCED_EXIT_CODE`) so that its launcher restarts it.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, Protocol

import torch

from commlayer.contract.backend import Backend
from commlayer.core import health
from commlayer.core.errors import PeerFailureError
from commlayer.core.netif import apply_interface_environment
from commlayer.core.processes import process_age
from commlayer.core.work import Work
from commlayer.ft.communicators import Communicator, Generation, build_generation, standalone_backend
from commlayer.ft.environment import JobEnvironment, connect_store, job_environment
from commlayer.ft.errors import StepAbortedError
from commlayer.ft.liveness import Heartbeat, Liveness
from commlayer.ft.options import FaultToleranceOptions
from commlayer.ft.quorum import Decision, Registration, joinable_replicas
from commlayer.ft.quorum_rounds import QuorumRounds
from commlayer.ft.record import JobRecord

__all__ = ["FENCED_EXIT_CODE", "Manager", "TrainingState"]

log = logging.getLogger("commlayer.ft")

_POLL_S = 0.0005
_CHECK_EVERY_S = 0.01
# A step lost elsewhere (a peer aborted it, a member of another communicator died) leaves an op
# whose own members all live this long to finish, so its communicator stays in step and is kept.
_OP_GRACE_S = 0.5
_FENCE_CHECK_S = 0.1
# A member its peers dropped as hung exits with this code (EX_TEMPFAIL): its launcher restarts it.
FENCED_EXIT_CODE = 75
# Aborted communicators: their destructors could block on a dead peer.
_ABANDONED: list[Communicator] = []


class TrainingState(Protocol):
    """What the Manager needs from the training engine to move state between replicas."""

    def state_step(self) -> int:
        """The step the held state is at (steps applied so far); -1 when it holds none."""

    def export_state(self) -> bytes:
        """This member's shard of the state (parameters' master copy and optimizer state)."""

    def import_state(self, payload: bytes, step: int) -> None:
        """Take a healthy peer's shard of the state, at ``step``."""


class Manager:
    """Heartbeats, quorum, generation rebuild, step commit and state transfer for one member.

    ``Manager(FaultToleranceOptions(shards=2))`` under ``commlayer run --ft`` (or torchrun) reads
    the store, this member's slot and the number of replicas from the launcher's environment
    (:mod:`.environment`).

    Args:
        options: see :class:`~.options.FaultToleranceOptions` (default: one shard per replica).
        store: the job's store, a ``torch.distributed.Store`` that outlives any member; None: the
            launcher's.
        member: this process's slot, ``replica * shards + shard``; None: the launcher's rank.
        sharded: whether state is partitioned across a replica's ranks (ZeRO stage >= 1).

    Raises:
        RendezvousEnvError: no store was given and no launcher that runs fault-tolerant jobs
            started this process.
        BackendUnavailableError: ``options.backend`` is unknown or cannot run here.
        UnsupportedError: ``options.backend`` cannot build standalone communicators
            (:meth:`commlayer.contract.backend.Backend.create_standalone`).
    """

    def __init__(
        self,
        options: FaultToleranceOptions | None = None,
        *,
        store: Any = None,
        member: int | None = None,
        sharded: bool = True,
    ) -> None:
        self.environment = None if store is not None else job_environment()
        options, member = _layout(options or FaultToleranceOptions(), member, self.environment)
        standalone_backend(options.backend)  # before the first quorum: every generation needs it
        if self.environment is not None:
            store = connect_store(self.environment, timedelta(seconds=options.store_timeout_s))
            # Members reach each other on the interface that reaches the store, as init does.
            apply_interface_environment(self.environment.store_host)
        self.store, self.member, self.options, self.sharded = store, member, options, sharded
        self.record = JobRecord(store, options.prefix)
        self._announce()
        self.heartbeat = Heartbeat(store, member, options)
        self.liveness = Liveness(store, options)
        self.rounds = QuorumRounds(
            store, member, options, sharded, self.liveness, self.record, self.environment
        )
        self.generation: Generation | None = None
        self.reconfigurations = 0
        self.timings: list[dict[str, Any]] = []  # one entry per generation this member entered
        self._started = time.monotonic() - (process_age(os.getpid()) or 0.0)
        self._spare: dict[str, Communicator] = {}  # idle communicators a next generation may keep
        self._outcome_key: str | None = None
        self._blocked: Communicator | None = None  # the op this member waits in
        self._lost_since: float | None = None  # when the waited op's step was found lost elsewhere
        self._starting = False  # inside a collective's start: a blocking backend waits there
        self._interrupted = False  # the watchdog stopped a blocked wait: keep no communicator
        self._last_check = 0.0
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="commlayer-ft-watchdog", daemon=True)
        self._watchdog.start()
        # A daemon thread still inside a store call when the interpreter finalizes is ended by
        # pthread_exit across C++ frames, which aborts the process: stop them first.
        atexit.register(self.close)

    def _announce(self) -> None:
        environment = self.environment
        if environment is None:
            return
        if environment.note is not None and self.member == 0:
            print(environment.note, file=sys.stderr, flush=True)
        if environment.slot_restart > 0:
            self.record.restarted(self.member, environment.slot_restart)

    def joining_at_start(self) -> bool:
        """Whether the job had already started when this member came (it then holds no state)."""
        return self.rounds.latest() > 0

    @property
    def prefix(self) -> str:
        """The job's key prefix in the store."""
        return self.options.prefix

    @property
    def slot(self) -> tuple[int, int]:
        """``(replica, shard)`` of this member: which micro-batch it trains on."""
        return self.options.slot(self.member)

    # --- generations ---------------------------------------------------------------------------

    def ensure_generation(self, state: TrainingState) -> Generation:
        """The current generation; after a failure or a join, a new one (quorum, rebuild, sync).

        Raises:
            PeerFailureError: a member died under a launcher that restarts whole jobs (torchrun,
                mpirun): this start of the job ends, the next resumes from its checkpoint.
        """
        environment = self.environment
        if self.generation is None and self.timings and environment and not environment.restarts_members:
            raise PeerFailureError(
                f"commlayer.ft: member {self.member}: a member of the job was lost, and {environment.launcher} "
                "restarts the whole job rather than one member: this start ends here and the next resumes "
                "from the last checkpoint"
            )
        while self.generation is None:
            began = time.monotonic()
            decision = self._quorum(state)
            phases = {"quorum_s": time.monotonic() - began}
            try:
                self.generation = self._build(decision)
                phases["communicators_s"] = time.monotonic() - began - sum(phases.values())
                self._outcome_key = f"{self.prefix}/g{decision.generation}/sync"
                received = self._sync_state(decision, state)
                phases["state_s"] = time.monotonic() - began - sum(phases.values())
                self._outcome_key = None
            except (StepAbortedError, RuntimeError) as error:
                log.warning(
                    "member %d: generation %d failed to start: %s", self.member, decision.generation, error
                )
                self.abandon()
                continue
            finally:
                self.reconfigurations += 1
            self._entered(decision, phases, received)
        return self.generation

    def _entered(self, decision: Decision, phases: dict[str, float], received: bool) -> None:
        generation = self.generation
        assert generation is not None
        kept = sum(1 for comm in generation.communicators() if comm.key in decision.reuse)
        entry = {"generation": decision.generation, "step": decision.step, "kept": kept, **phases}
        self.timings.append(entry)
        log.info(
            "member %d: generation %d members %s step %d (kept %d communicators; quorum %.3fs, "
            "communicators %.3fs, state %.3fs)",
            *(self.member, decision.generation, decision.members, decision.step, kept),
            *(phases["quorum_s"], phases["communicators_s"], phases["state_s"]),
        )
        slot_restart = self.environment.slot_restart if self.environment is not None else 0
        if received and slot_restart > 0:
            since_start = time.monotonic() - self._started
            self.record.rejoined(
                self.member, {"restart": slot_restart, **entry, "since_start_s": since_start}
            )

    def _build(self, decision: Decision) -> Generation:
        kept = {key: comm for key, comm in self._spare.items() if key in decision.reuse}
        for key, comm in self._spare.items():
            if key not in kept:
                _abort(comm)
        self._spare = {}
        # Building waits for the slowest member: waiting, not hung, however long it takes.
        self.heartbeat.waiting(True)
        try:
            return build_generation(self.store, decision, self.member, self.options, self.sharded, kept)
        except BaseException:
            for comm in kept.values():
                _abort(comm)
            raise
        finally:
            self.heartbeat.waiting(False)

    def abandon(self) -> None:
        """Leave the current generation (its step aborts for everyone); the next step re-forms.

        Communicators this member left idle are kept for the next quorum to judge; the others
        are aborted."""
        if self._outcome_key is not None:
            self.store.compare_set(self._outcome_key, "", "abort")
        if self.generation is not None:
            for comm in self.generation.communicators():
                if comm.idle and not self._interrupted:
                    self._spare[comm.key] = comm
                else:
                    _abort(comm)
        self.generation, self._outcome_key, self._interrupted = None, None, False
        health.clear()

    def begin(self, phase: str) -> None:
        """Collectives from now on belong to ``phase`` (e.g. ``"s12"``) of the current generation:
        a member that fails in it aborts it for every member."""
        assert self.generation is not None
        self._outcome_key = f"{self.prefix}/g{self.generation.number}/{phase}/outcome"
        self.heartbeat.progress()

    def finish(self) -> None:
        """This member trained every step: members still waiting to join give up, and it stops
        heartbeating."""
        self.record.finish()
        self.close()

    def close(self) -> None:
        """Stop this member's heartbeat and watchdog threads (also run at interpreter exit)."""
        self._closed.set()
        self.heartbeat.stop()
        if self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=2)

    # --- collectives ---------------------------------------------------------------------------

    def run(self, comm: Communicator, start: Callable[[Backend], Work]) -> None:
        """Start a collective, ``start(comm.backend)``, and wait for it; StepAbortedError when the
        step is lost (the communicator then counts an unfinished op and is not kept)."""
        self._blocked, self._lost_since = comm, None
        self.heartbeat.waiting(True)
        comm.issued += 1
        try:
            self._starting = True
            work = start(comm.backend)
            self._starting = False
            while not work.is_completed():
                if time.monotonic() - self._last_check >= _CHECK_EVERY_S:
                    self._last_check = time.monotonic()
                    if (reason := self._op_verdict(comm)) is not None:
                        raise StepAbortedError(f"member {self.member}: {reason}")
                time.sleep(_POLL_S)
            work.wait()
            comm.completed += 1
            if self._lost_since is not None:  # finished in step, but the step is lost elsewhere
                raise StepAbortedError(f"member {self.member}: the step was lost while this op finished")
        except StepAbortedError:
            raise
        except RuntimeError as error:  # a peer's death surfaces as the library's error
            raise StepAbortedError(f"member {self.member}: collective failed: {error}") from error
        finally:
            self._blocked, self._starting = None, False
            self.heartbeat.waiting(False)

    def commit(self, step: int) -> dict[str, Any]:
        """Agree through the store that every member finished ``step``'s collectives (after
        ``begin(f"s{step}")``).

        Returns:
            The outcome: ``"replicas"``, those that contributed; ``"join"``, whether standby
            members complete a replica (the caller then starts a new generation).

        Raises:
            StepAbortedError: a member failed before finishing; nobody applies the step.
        """
        generation = self.generation
        assert generation is not None and self._outcome_key is not None
        base = f"{self.prefix}/g{generation.number}/s{step}"
        members = generation.decision.members
        if self.store.add(f"{base}/done", 1) == len(members):
            joins = joinable_replicas(self.rounds.standby(set(members)), set(members), self.options)
            replicas = generation.decision.replicas(self.options)
            outcome = json.dumps({"join": bool(joins), "replicas": replicas})
            if self.store.compare_set(self._outcome_key, "", outcome).decode() == outcome:
                self.record.commit(step, replicas)
        self.heartbeat.waiting(True)
        try:
            while not self.store.check([self._outcome_key]):
                try:
                    self._check(force=False)
                except StepAbortedError:
                    # The outcome may have been decided meanwhile: the store's value is the one
                    # every member acts on, so a death after the last member finished aborts nothing.
                    self.store.compare_set(self._outcome_key, "", "abort")
                    break
                time.sleep(_POLL_S)
        finally:
            self.heartbeat.waiting(False)
        value = self.store.get(self._outcome_key).decode()
        if value == "abort":
            raise StepAbortedError(f"member {self.member}: step {step} aborted by a peer or a death")
        self._outcome_key = None
        return json.loads(value)

    def _check(self, force: bool) -> None:
        now = time.monotonic()
        if not force and now - self._last_check < _CHECK_EVERY_S:
            return
        self._last_check = now
        found = self._abort_reason()
        if found is not None:
            raise StepAbortedError(f"member {self.member}: {found[0]}")

    def _op_verdict(self, comm: Communicator) -> str | None:
        """Why to leave the op waited on ``comm`` now: a member of ``comm`` died, or the step was
        lost elsewhere and the op has not finished within its grace."""
        found = self._abort_reason(comm.members)
        if found is None:
            return None
        reason, fatal = found
        now = time.monotonic()
        self._lost_since = self._lost_since or now
        return reason if fatal or now - self._lost_since > _OP_GRACE_S else None

    def _abort_reason(self, members: tuple[int, ...] | None = None) -> tuple[str, bool] | None:
        """Why the current phase is lost, and whether that dooms an op over ``members`` (default:
        every member of the generation), or None."""
        generation, key = self.generation, self._outcome_key
        if generation is None or key is None:
            return None
        if self.store.check([key]):  # decided: every member acts on the same outcome
            return ("a peer aborted the step", members is None) if self.store.get(key) == b"abort" else None
        incarnations = generation.decision.incarnations
        dead = self.liveness.dead(
            (m for m in generation.decision.members if m != self.member),
            {int(k): v for k, v in incarnations.items()},
        )
        for member in dead:
            if self.liveness.hung(member):  # alive but stuck: it leaves, and comes back restarted
                self.record.fence(member, incarnations[member])
        if dead:
            return f"members died: {dead}", members is None or any(member in members for member in dead)
        return None

    def _watch(self) -> None:
        """Interrupt a collective that runs in the calling thread (shm) when its step is lost, and
        leave the job when the peers dropped this member as hung."""
        fence_checked = 0.0
        while not self._closed.wait(0.02):
            try:
                if time.monotonic() - fence_checked > _FENCE_CHECK_S:
                    fence_checked = time.monotonic()
                    self._leave_if_fenced()
                blocked = self._blocked
                reason = None if blocked is None else self._op_verdict(blocked)
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return
            if reason is not None and blocked is not None and self._blocked is blocked and self._starting:
                self._interrupted = True
                health.report(blocked.backend.spec.ranks[0], reason)

    def _leave_if_fenced(self) -> None:
        """Leave when the peers dropped this member as hung and it has not moved on for another
        ``hang_timeout_s`` (a member that was only slow rejoins through the quorum instead)."""
        fence = self.record.fenced(self.member)
        if fence is None or fence[0] != self.heartbeat.incarnation:
            return
        if self.heartbeat.last_progress > fence[1] or time.time() - fence[1] < self.options.hang_timeout_s:
            return
        print(
            f"commlayer.ft: member {self.member}: its peers dropped it as hung (no progress for "
            f"{self.options.hang_timeout_s}s while they waited); where each thread was:",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(all_threads=True)
        os._exit(FENCED_EXIT_CODE)  # its main thread is stuck: only the process can end it

    # --- quorum --------------------------------------------------------------------------------

    def _quorum(self, state: TrainingState) -> Decision:
        idle = {key: comm.completed for key, comm in self._spare.items()}
        self.heartbeat.waiting(True)
        try:
            return self.rounds.agree(Registration(self.heartbeat.incarnation, state.state_step(), idle))
        finally:
            self.heartbeat.waiting(False)

    # --- state transfer ------------------------------------------------------------------------

    def _sync_state(self, decision: Decision, state: TrainingState) -> bool:
        """Send the newest state to the members lacking it; True when this member received it."""
        generation = self.generation
        assert generation is not None
        if not decision.sources:
            return False
        if self.sharded:
            group = generation.replica_group
            source = decision.sources[self.options.slot(self.member)[1]]
            root = decision.replicas(self.options).index(self.options.slot(source)[0])
        else:
            group, source = generation.world, decision.sources[0]
            root = decision.members.index(source)
        if group is None:  # alone in its group: it holds the newest state itself
            return False
        payload = state.export_state() if source == self.member else b""
        device = group.backend.object_device()
        size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
        self.run(group, lambda backend: backend.broadcast(size, root, async_op=True))
        data = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
            if payload
            else torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        )
        self.run(group, lambda backend: backend.broadcast(data, root, async_op=True))
        if source == self.member:
            return False
        state.import_state(data.cpu().numpy().tobytes(), decision.step)
        return True


def _layout(
    options: FaultToleranceOptions, member: int | None, environment: JobEnvironment | None
) -> tuple[FaultToleranceOptions, int]:
    """The options with the launcher's replicas and key prefix, and this member's slot."""
    if environment is not None:
        world = options.for_world(environment.world_size)
        options = replace(world, prefix=environment.prefix_of(options.prefix))
        member = environment.member if member is None else member
    if member is None or options.replicas is None:
        raise ValueError(
            "Manager: with a store given, arguments 'member' and 'options.replicas' expected, "
            f"received member={member}, replicas={options.replicas}"
        )
    if not 0 <= member < options.members:
        raise ValueError(f"Manager: argument 'member' expected in [0, {options.members}), received {member}")
    return options, member


def _abort(comm: Communicator) -> None:
    comm.abort()
    _ABANDONED.append(comm)
