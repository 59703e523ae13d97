"""Members for the --ft launcher tests: examples/fault_tolerant_training.py, broken on purpose.

    commlayer run --ft ... tests/launch/ft_launch_ranks.py fail-restarts MARK_FILE [example arguments]
    commlayer run --ft ... tests/launch/ft_launch_ranks.py die-once RANK STEP [example arguments]

``fail-restarts``: a replacement (``$COMMLAYER_FT_SLOT_RESTART`` > 0) writes the time to
MARK_FILE and exits 1 before joining, as a member whose restart keeps failing would.
``die-once``: the first start of RANK SIGKILLs itself once the job committed STEP (read from
the launcher's store), for hosts the test cannot reach.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fault_tolerant_training.py"


def die_after(step: int) -> None:
    import torch.distributed as torch_dist

    host, port = os.environ["COMMLAYER_FT_STORE"].rsplit(":", 1)
    store = torch_dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
    while not store.check(["ft/committed"]) or int(store.get("ft/committed")) < step:
        time.sleep(0.01)
    print(json.dumps({"killed_at": time.time()}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    mode = sys.argv.pop(1)
    restart = int(os.environ.get("COMMLAYER_FT_SLOT_RESTART") or 0)
    if mode == "fail-restarts":
        mark = Path(sys.argv.pop(1))
        if restart > 0:
            mark.write_text(str(time.time()))
            raise SystemExit("ft_launch_ranks: this replacement cannot start")
    elif mode == "die-once":
        rank, step = int(sys.argv.pop(1)), int(sys.argv.pop(1))
        if restart == 0 and int(os.environ["RANK"]) == rank:
            threading.Thread(target=die_after, args=(step,), daemon=True).start()
    runpy.run_path(str(EXAMPLE), run_name="__main__")


if __name__ == "__main__":
    main()
