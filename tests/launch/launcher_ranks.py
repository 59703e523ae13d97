"""A rank program for tests/launch/test_launcher.py: plain Python (no torch), so worlds start instantly.

    python rank_behaviour.py [--fail-rank R [--exit-code C | --kill-self]] [--block] [--trap-signals] [ARGS...]

Every rank prints its launcher variables and ARGS on stdout and one line on stderr. Then rank R
exits with code C (or SIGKILLs itself), ``--block`` makes the others wait forever, and
``--trap-signals`` makes every rank print ``ready``, then report the SIGINT/SIGTERM it receives and
exit 0 (a SIGUSR1 is reported and the rank goes on).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

VARIABLES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTHONUNBUFFERED",
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=None)
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--kill-self", action="store_true")
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--trap-signals", action="store_true")
    options, extra = parser.parse_known_args()
    rank = int(os.environ["RANK"])
    print("env " + " ".join(f"{name}={os.environ.get(name)}" for name in VARIABLES) + f" args={extra}")
    print(f"rank {rank} says hello on stderr", file=sys.stderr)
    if options.trap_signals:
        return _wait_for_signal(rank)
    if rank == options.fail_rank:
        if options.kill_self:
            os.kill(os.getpid(), signal.SIGKILL)
        return options.exit_code
    if options.block:
        time.sleep(3600)
    return 0


def _wait_for_signal(rank: int) -> int:
    def report(signum: int, _frame: object) -> None:
        print(f"rank {rank} got {signal.Signals(signum).name}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGINT, report)
    signal.signal(signal.SIGTERM, report)
    signal.signal(signal.SIGUSR1, lambda signum, frame: print(f"rank {rank} got SIGUSR1", flush=True))
    print("ready", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    raise SystemExit(main())
