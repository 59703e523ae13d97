"""A world in which one rank is SIGKILLed inside a collective; the others must fail clearly.

Started directly (not through the harness worker, which would stop the world at the first death)::

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python -m tests.backends.shm_death_ranks VICTIM TIMEOUT_S

The victim kills itself from a helper thread while its main thread loops on 4 MiB all_reduces (so
it dies inside one); every survivor loops too and must raise a commlayer error naming the group
well within the group timeout. Each survivor prints ``SURVIVOR <rank> <seconds> <error>``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch

from commlayer import dist
from commlayer.core.errors import CommError


def main(victim: int, timeout_s: float) -> None:
    dist.init_process_group("shm", timeout=timedelta(seconds=timeout_s))
    me = dist.get_rank()
    tensor = torch.ones(1 << 20)
    dist.all_reduce(tensor)
    if me == victim:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    started = time.monotonic()
    try:
        while True:
            dist.all_reduce(tensor)
    except CommError as error:
        print(f"SURVIVOR {me} {time.monotonic() - started:.2f} {error}", flush=True)
    # No destroy: the companion gloo group would wait for the dead rank.
    os._exit(0)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
