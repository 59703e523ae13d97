"""Rank body of the launch-error tests: init with the environment given, record how it ended.

``python -m tests.reliability.launch_errors_ranks OUT_FILE TIMEOUT_S`` writes one JSON record: the
error's type, bases and message (or "joined"), the seconds init took, and when it was written.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

from commlayer import dist


def main(out: str, timeout_s: float) -> None:
    started = time.monotonic()
    record: dict[str, object] = {}
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        record["outcome"] = "joined"
        dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - the record is what the test checks
        record.update(
            outcome="error",
            type=type(error).__name__,
            bases=[kind.__name__ for kind in type(error).__mro__],
            message=str(error),
        )
    record["init_s"] = round(time.monotonic() - started, 3)
    record["t_recorded"] = time.time()
    Path(out).write_text(json.dumps(record))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
