"""torch arguments commlayer accepts for compatibility but cannot honour: logged once, with why.

Silently dropping them would hide that a script relies on torch behaviour commlayer does not
have; raising would break scripts that pass them out of habit. So each (op, argument) is logged
once per process, at WARNING, the first time a caller passes a value other than torch's default.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

__all__ = ["note_ignored"]

log = logging.getLogger("commlayer.dist")

# Why each argument has no effect here.
_REASONS = {
    ("init_process_group", "device_id"): (
        "commlayer builds communicators lazily per group; pass tensors on the device instead"
    ),
    ("init_process_group", "group_name"): "the default group is always named 'world'",
    ("new_group", "use_local_synchronization"): (
        "every world rank takes part in new_group (some backends need it), as torch's default does"
    ),
    ("new_group", "group_desc"): "groups are described by their generated names ('group1', ...)",
    ("barrier", "device_ids"): "the backend's barrier synchronises the group, whatever the devices",
}
_logged: set[tuple[str, str]] = set()
_lock = threading.Lock()


def note_ignored(op: str, arg: str, value: Any) -> None:
    """Log once per process that ``op`` ignores ``arg`` (only called for non-default values)."""
    key = (op, arg)
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    log.warning("%s: argument '%s'=%r is accepted but has no effect: %s", op, arg, value, _REASONS[key])
