"""The quorum's rounds in the store: register, wait for every live member, agree on a decision.

Round ``N`` lives under ``<prefix>/q<N>``: each member writes its :class:`~.quorum.Registration`,
and once every member that looks alive has registered, any of them proposes the pure
:func:`~.quorum.decide` outcome with ``compare_set`` (the first proposal wins). ``<prefix>/latest``
names the newest round; a member that finds a newer one registers again there. Members left out
of a decision (an incomplete replica) stay on standby, listed under ``<prefix>/standby``, until
a commit finds that they complete a replica.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from commlayer.ft.environment import JobEnvironment, tell_keeper
from commlayer.ft.errors import JobFinishedError, NoHealthyReplicaError
from commlayer.ft.liveness import Liveness
from commlayer.ft.options import FaultToleranceOptions
from commlayer.ft.quorum import Decision, Registration, decide
from commlayer.ft.record import JobRecord

__all__ = ["QuorumRounds"]

_POLL_S = 0.005


class QuorumRounds:
    """One member's side of the quorum rounds (see the module docstring)."""

    def __init__(
        self,
        store: Any,
        member: int,
        options: FaultToleranceOptions,
        sharded: bool,
        liveness: Liveness,
        record: JobRecord,
        environment: JobEnvironment | None,
    ) -> None:
        self.store, self.member, self.options, self.sharded = store, member, options, sharded
        self.prefix = options.prefix
        self.liveness, self.record, self.environment = liveness, record, environment

    def latest(self) -> int:
        """The newest round started (0 before the first)."""
        key = f"{self.prefix}/latest"
        return int(self.store.get(key)) if self.store.check([key]) else 0

    def agree(self, registration: Registration) -> Decision:
        """Take part in rounds until one decides with this member in it.

        Raises:
            JobFinishedError: the job finished while this member waited (SystemExit(0) instead
                under a slot keeper: nothing is left for the member to do).
            NoHealthyReplicaError: no live member holds some shard of the state.
        """
        while True:
            number = self.latest() + 1
            self.store.set(f"{self.prefix}/q{number}/reg/{self.member}", registration.to_json())
            self.store.set(f"{self.prefix}/standby/{self.member}", registration.incarnation)
            decision = self._await_decision(number)
            if decision is None:
                continue
            if self.member in decision.members:
                self.store.set(f"{self.prefix}/latest", str(number))
                self.store.delete_key(f"{self.prefix}/standby/{self.member}")
                return decision
            if self.latest() < number:
                self.store.set(f"{self.prefix}/latest", str(number))

    def standby(self, members: set[int]) -> set[int]:
        """Live members outside ``members`` waiting to join."""
        found = set()
        for member in range(self.options.members):
            key = f"{self.prefix}/standby/{member}"
            if member not in members and self.store.check([key]):
                incarnation = self.store.get(key).decode()
                if self.liveness.dead_reason(member, incarnation) is None:
                    found.add(member)
        return found

    def _await_decision(self, number: int) -> Decision | None:
        """The decision of round ``number``, proposing one once every live member registered;
        None when a later round started meanwhile."""
        key = f"{self.prefix}/q{number}/decision"
        started = time.monotonic()
        while True:
            if self.store.check([key]):
                return self._read_decision(self.store.get(key))
            if self.latest() >= number:  # the decision may have landed since the check above
                return self._read_decision(self.store.get(key)) if self.store.check([key]) else None
            if self.record.finished:
                self._finished_before_joining()
            registered = self._registrations(number)
            alive = {m for m in range(self.options.members) if self.liveness.dead_reason(m) is None}
            live = {m: r for m, r in registered.items() if m in alive and self._current(m, r)}
            patient = number == 1 and time.monotonic() - started < self.options.quorum_timeout_s
            if alive <= set(live) and not (patient and len(live) < self.options.members):
                proposal = self._propose(number, live)
                if proposal is not None:
                    return self._read_decision(self.store.compare_set(key, "", proposal))
            time.sleep(_POLL_S)

    def _finished_before_joining(self) -> None:
        message = f"member {self.member}: the job finished before this member could join"
        if self.environment is not None and self.environment.channel is not None:
            # Restarted in its slot by `commlayer run --ft`: nothing is left for it to do.
            print(f"commlayer.ft: {message}; nothing is left for it to do", file=sys.stderr, flush=True)
            raise SystemExit(0)
        raise JobFinishedError(message)

    def _registrations(self, number: int) -> dict[int, Registration]:
        found = {}
        for member in range(self.options.members):
            key = f"{self.prefix}/q{number}/reg/{member}"
            if self.store.check([key]):
                found[member] = Registration.from_json(self.store.get(key))
        return found

    def _current(self, member: int, registration: Registration) -> bool:
        beat = self.liveness.beat(member)
        return beat is not None and beat.incarnation == registration.incarnation

    def _propose(self, number: int, live: dict[int, Registration]) -> str | None:
        try:
            decision = decide(number, live, self.options, self.sharded)
        except NoHealthyReplicaError as error:
            return json.dumps({"error": str(error)})
        return None if decision is None else decision.to_json()

    def _read_decision(self, raw: bytes) -> Decision:
        parsed = json.loads(raw)
        if "error" in parsed:
            self.record.fail(parsed["error"])
            tell_keeper(self.environment, "lost")  # a restart of this member cannot help
            raise NoHealthyReplicaError(parsed["error"])
        return Decision.from_json(raw)
