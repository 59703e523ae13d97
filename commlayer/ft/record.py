"""What a fault-tolerant job writes in its store for the launcher, and the launcher's reading of it.

Under the job's key prefix (:func:`commlayer.ft.environment.job_prefix`)::

    committed            the last step every member of a generation committed
    contributions/<t>    the replicas whose gradients step t averaged (JSON list)
    finished             set by the first member that trained every step
    failed               why the job cannot go on (no live member holds some shard)
    restarts/<m>         how many times the launcher restarted member m in its slot
    rejoined/<m>         how member m's last replacement caught up (JSON: step, seconds per phase)
    fenced/<m>           the incarnation of member m that its peers dropped as hung, and when
"""

from __future__ import annotations

import json
import time
from typing import Any

__all__ = ["JobRecord"]


class JobRecord:
    """The job's record in ``store`` under ``prefix`` (members write it, the launcher reads it)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self.store, self.prefix = store, prefix

    def _key(self, *parts: object) -> str:
        return "/".join([self.prefix, *map(str, parts)])

    def _get(self, *parts: object) -> str | None:
        key = self._key(*parts)
        return self.store.get(key).decode() if self.store.check([key]) else None

    # --- members ---------------------------------------------------------------------------------

    def commit(self, step: int, replicas: list[int]) -> None:
        """Step ``step`` was applied with the gradients of ``replicas``."""
        self.store.set(self._key("contributions", step), json.dumps(replicas))
        self.store.set(self._key("committed"), str(step))

    def finish(self) -> None:
        self.store.set(self._key("finished"), "1")

    def fail(self, reason: str) -> None:
        self.store.set(self._key("failed"), reason)

    def restarted(self, member: int, count: int) -> None:
        self.store.set(self._key("restarts", member), str(count))

    def rejoined(self, member: int, details: dict[str, Any]) -> None:
        self.store.set(self._key("rejoined", member), json.dumps(details))

    def fence(self, member: int, incarnation: str) -> None:
        """Peers dropped ``incarnation`` of ``member`` as hung, now: unless it moves on, it leaves."""
        self.store.set(self._key("fenced", member), json.dumps([incarnation, time.time()]))

    def fenced(self, member: int) -> tuple[str, float] | None:
        """The incarnation of ``member`` its peers dropped as hung, and when, if any."""
        found = self._get("fenced", member)
        if found is None:
            return None
        incarnation, when = json.loads(found)
        return incarnation, when

    @property
    def finished(self) -> bool:
        return self.store.check([self._key("finished")])

    # --- the launcher ----------------------------------------------------------------------------

    def failure(self) -> str | None:
        """Why the job cannot go on, or None."""
        return self._get("failed")

    def committed(self) -> int | None:
        """The last step committed, or None before the first."""
        found = self._get("committed")
        return None if found is None else int(found)

    def summary(self, members: int) -> dict[str, Any]:
        """Everything above as one JSON-ready dict (``members`` slots)."""
        committed = self.committed()
        contributions = {}
        for step in range(0 if committed is None else committed + 1):
            found = self._get("contributions", step)
            if found is not None:
                contributions[step] = json.loads(found)
        rejoined = {m: json.loads(r) for m in range(members) if (r := self._get("rejoined", m))}
        return {
            "finished": self.finished,
            "failed": self.failure(),
            "committed": committed,
            "restarts": {m: int(r) for m in range(members) if (r := self._get("restarts", m))},
            "rejoined": rejoined,
            "contributions": contributions,
        }
