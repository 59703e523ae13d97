"""The Manager: one member's view of a fault-tolerant data-parallel job.

Per step: every collective is started async and waited here, polling the store for the step's
outcome and the generation's peers' liveness, so a death or a hang abandons the step in
milliseconds instead of at a timeout (a backend whose ops run in the calling thread, like shm,
is interrupted by the watchdog thread through :mod:`commlayer.core.health`). The step then commits
through the store: the last member to finish writes the outcome with ``compare_set``, and an
aborting member writes "abort" the same way, so every member sees the same outcome. After an
abort, or when standby members complete a replica, the members run a new quorum
(:mod:`.quorum`), build the next generation's communicators (:mod:`.communicators`) and the
members lacking the newest state receive it from a healthy peer over the backend.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch

from commlayer.contract.backend import Backend
from commlayer.core import health
from commlayer.core.work import Work
from commlayer.ft.communicators import Generation, build_generation, standalone_backend
from commlayer.ft.errors import JobFinishedError, NoHealthyReplicaError, StepAbortedError
from commlayer.ft.liveness import Heartbeat, Liveness
from commlayer.ft.options import FaultToleranceOptions
from commlayer.ft.quorum import Decision, Registration, decide, joinable_replicas

__all__ = ["Manager", "TrainingState"]

log = logging.getLogger("commlayer.ft")

_POLL_S = 0.0005
_CHECK_EVERY_S = 0.01
# Communicators of abandoned generations: their destructors could block on a dead peer.
_ABANDONED: list[Generation] = []


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

    Args:
        store: the job's rendezvous store (a ``torch.distributed.Store`` that outlives any member,
            e.g. the launcher's TCPStore).
        member: this process's slot, ``replica * shards + shard``.
        options: see :class:`~.options.FaultToleranceOptions`.
        sharded: whether state is partitioned across a replica's ranks (ZeRO stage >= 1).

    Raises:
        BackendUnavailableError: ``options.backend`` is unknown or cannot run here.
        UnsupportedError: ``options.backend`` cannot build standalone communicators
            (:meth:`commlayer.contract.backend.Backend.create_standalone`).
    """

    def __init__(self, store: Any, member: int, options: FaultToleranceOptions, sharded: bool) -> None:
        if not 0 <= member < options.members:
            raise ValueError(
                f"Manager: argument 'member' expected in [0, {options.members}), received {member}"
            )
        standalone_backend(options.backend)  # before the first quorum: every generation needs it
        self.store, self.member, self.options, self.sharded = store, member, options, sharded
        self.heartbeat = Heartbeat(store, member, options)
        self.liveness = Liveness(store, options)
        self.generation: Generation | None = None
        self.reconfigurations = 0
        self._outcome_key: str | None = None
        self._blocked: Backend | None = None
        self._last_check = 0.0
        self._watchdog = threading.Thread(target=self._watch, name="commlayer-ft-watchdog", daemon=True)
        self._watchdog.start()

    def joining_at_start(self) -> bool:
        """Whether the job had already started when this member came (it then holds no state)."""
        return self._latest() > 0

    @property
    def prefix(self) -> str:
        """The job's key prefix in the store."""
        return self.options.prefix

    # --- generations ---------------------------------------------------------------------------

    def ensure_generation(self, state: TrainingState) -> Generation:
        """The current generation; after a failure or a join, a new one (quorum, rebuild, sync)."""
        while self.generation is None:
            decision = self._quorum(state)
            try:
                self.generation = self._build(decision)
                self._outcome_key = f"{self.prefix}/g{decision.generation}/sync"
                self._sync_state(decision, state)
                self._outcome_key = None
            except (StepAbortedError, RuntimeError) as error:
                log.warning(
                    "member %d: generation %d failed to start: %s", self.member, decision.generation, error
                )
                self.abandon()
            self.reconfigurations += 1
            log.info(
                "member %d: generation %d members %s step %d",
                self.member,
                decision.generation,
                decision.members,
                decision.step,
            )
        return self.generation

    def _build(self, decision: Decision) -> Generation:
        # Building waits for the slowest member: waiting, not hung, however long it takes.
        self.heartbeat.waiting(True)
        try:
            return build_generation(self.store, decision, self.member, self.options)
        finally:
            self.heartbeat.waiting(False)

    def abandon(self) -> None:
        """Leave the current generation (its step aborts for everyone); the next step re-forms."""
        if self._outcome_key is not None:
            self.store.compare_set(self._outcome_key, "", "abort")
        if self.generation is not None:
            self.generation.abort()
            _ABANDONED.append(self.generation)
        self.generation, self._outcome_key = None, None
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
        self.store.set(f"{self.prefix}/finished", "1")
        self.heartbeat.stop()

    # --- collectives ---------------------------------------------------------------------------

    def run(self, group: Backend, start: Callable[[], Work]) -> None:
        """Start a collective on ``group`` and wait for it; StepAbortedError when the step is lost."""
        self._blocked = group
        self.heartbeat.waiting(True)
        try:
            work = start()
            while not work.is_completed():
                self._check(force=False)
                time.sleep(_POLL_S)
            work.wait()
        except StepAbortedError:
            raise
        except RuntimeError as error:  # a peer's death surfaces as the library's error
            raise StepAbortedError(f"member {self.member}: collective failed: {error}") from error
        finally:
            self._blocked = None
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
            joins = joinable_replicas(self._standby(set(members)), set(members), self.options)
            replicas = generation.decision.replicas(self.options)
            outcome = json.dumps({"join": bool(joins), "replicas": replicas})
            if self.store.compare_set(self._outcome_key, "", outcome).decode() == outcome:
                self.store.set(f"{self.prefix}/contributions/{step}", json.dumps(replicas))
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
        reason = self._abort_reason()
        if reason is not None:
            raise StepAbortedError(f"member {self.member}: {reason}")

    def _abort_reason(self) -> str | None:
        generation, key = self.generation, self._outcome_key
        if generation is None or key is None:
            return None
        if self.store.check([key]):  # decided: every member acts on the same outcome
            return "a peer aborted the step" if self.store.get(key) == b"abort" else None
        incarnations = generation.decision.incarnations
        dead = self.liveness.dead(
            (m for m in generation.decision.members if m != self.member),
            {int(k): v for k, v in incarnations.items()},
        )
        if dead:
            return f"members died: {dead}"
        return None

    def _watch(self) -> None:
        """Interrupt a collective that runs in the calling thread (shm) when its step is lost."""
        while True:
            time.sleep(0.02)
            blocked = self._blocked
            if blocked is None:
                continue
            try:
                reason = self._abort_reason()
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return
            if reason is not None and self._blocked is blocked:
                health.report(blocked.spec.ranks[0], reason)

    # --- quorum --------------------------------------------------------------------------------

    def _latest(self) -> int:
        key = f"{self.prefix}/latest"
        return int(self.store.get(key)) if self.store.check([key]) else 0

    def _registrations(self, number: int) -> dict[int, Registration]:
        found = {}
        for member in range(self.options.members):
            key = f"{self.prefix}/q{number}/reg/{member}"
            if self.store.check([key]):
                found[member] = Registration.from_json(self.store.get(key))
        return found

    def _standby(self, members: set[int]) -> set[int]:
        found = set()
        for member in range(self.options.members):
            key = f"{self.prefix}/standby/{member}"
            if member not in members and self.store.check([key]):
                incarnation = self.store.get(key).decode()
                if self.liveness.dead_reason(member, incarnation) is None:
                    found.add(member)
        return found

    def _quorum(self, state: TrainingState) -> Decision:
        self.heartbeat.waiting(True)
        try:
            while True:
                number = self._latest() + 1
                registration = Registration(self.heartbeat.incarnation, state.state_step())
                self.store.set(f"{self.prefix}/q{number}/reg/{self.member}", registration.to_json())
                self.store.set(f"{self.prefix}/standby/{self.member}", self.heartbeat.incarnation)
                decision = self._await_decision(number)
                if decision is None:
                    continue
                if self.member in decision.members:
                    self.store.set(f"{self.prefix}/latest", str(number))
                    self.store.delete_key(f"{self.prefix}/standby/{self.member}")
                    return decision
                if self._latest() < number:
                    self.store.set(f"{self.prefix}/latest", str(number))
        finally:
            self.heartbeat.waiting(False)

    def _await_decision(self, number: int) -> Decision | None:
        """The decision of quorum ``number``, proposing one once every live member registered;
        None when a later quorum started meanwhile."""
        key = f"{self.prefix}/q{number}/decision"
        started = time.monotonic()
        while True:
            if self.store.check([key]):
                return _read_decision(self.store.get(key))
            if self._latest() >= number:  # the decision may have landed since the check above
                return _read_decision(self.store.get(key)) if self.store.check([key]) else None
            if self.store.check([f"{self.prefix}/finished"]):
                raise JobFinishedError(
                    f"member {self.member}: the job finished before this member could join"
                )
            registered = self._registrations(number)
            alive = {m for m in range(self.options.members) if self.liveness.dead_reason(m) is None}
            live = {m: r for m, r in registered.items() if m in alive and self._current(m, r)}
            patient = number == 1 and time.monotonic() - started < self.options.quorum_timeout_s
            if alive <= set(live) and not (patient and len(live) < self.options.members):
                proposal = self._propose(number, live)
                if proposal is not None:
                    return _read_decision(self.store.compare_set(key, "", proposal))
            time.sleep(0.005)

    def _current(self, member: int, registration: Registration) -> bool:
        beat = self.liveness.beat(member)
        return beat is not None and beat.incarnation == registration.incarnation

    def _propose(self, number: int, live: dict[int, Registration]) -> str | None:
        try:
            decision = decide(number, live, self.options, self.sharded)
        except NoHealthyReplicaError as error:
            return json.dumps({"error": str(error)})
        return None if decision is None else decision.to_json()

    # --- state transfer ------------------------------------------------------------------------

    def _sync_state(self, decision: Decision, state: TrainingState) -> None:
        generation = self.generation
        assert generation is not None
        if not decision.sources:
            return
        if self.sharded:
            group = generation.replica_group
            source = decision.sources[self.options.slot(self.member)[1]]
            root = decision.replicas(self.options).index(self.options.slot(source)[0])
        else:
            group, source = generation.world, decision.sources[0]
            root = decision.members.index(source)
        payload = state.export_state() if source == self.member else b""
        device = group.object_device()
        size = torch.tensor([len(payload)], dtype=torch.int64, device=device)
        self.run(group, lambda: group.broadcast(size, root, async_op=True))
        data = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
            if payload
            else torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        )
        self.run(group, lambda: group.broadcast(data, root, async_op=True))
        if source != self.member:
            state.import_state(data.cpu().numpy().tobytes(), decision.step)


def _read_decision(raw: bytes) -> Decision:
    parsed = json.loads(raw)
    if "error" in parsed:
        raise NoHealthyReplicaError(parsed["error"])
    return Decision.from_json(raw)
