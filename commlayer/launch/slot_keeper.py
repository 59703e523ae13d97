"""``python -m commlayer.launch.slot_keeper``: keep one member of a fault-tolerant job running.

``commlayer run --ft`` starts one keeper per member slot (here, on each host through the agent,
or as each srun task); the keeper runs the member with the slot's environment and, when it
fails, starts it again in the same slot (same host, ``RANK``, ``LOCAL_RANK`` and so device) after
a backoff of 0.5 s, doubling up to 8 s, at most ``--max-restarts`` times. Each start sees
``$COMMLAYER_FT_SLOT_RESTART`` (0, then 1..N). The replacement joins the running job and receives
the newest state from a peer (:mod:`commlayer.ft`)::

    commlayer run: rank 3 was killed by SIGKILL (exit code 137); restarting it in its slot in 0.5s (restart 1 of 3)

The keeper exits 0 when the member exits 0 (it finished, or it came back after the others
finished). It gives up, exiting with the member's status, when the restarts are spent or when the
member says on the pipe ``$COMMLAYER_FT_CHANNEL`` that restarting cannot help (no live member
holds some shard of the state); its last line then reads::

    commlayer run: rank 3 gave up after 3 restarts in its slot: it was killed by SIGKILL (exit code 137)

A SIGINT or SIGTERM reaches the member through the keeper's process group (the supervisor
signals groups); the keeper then restarts nothing and exits with the member's status. The member
dies with the keeper (PR_SET_PDEATHSIG), and the keeper with its supervisor.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from commlayer.core import settings
from commlayer.launch.supervise import child_setup, describe_exit, shell_code

__all__ = ["GAVE_UP", "backoff_seconds", "keeper_command", "main"]

GAVE_UP = "gave up after"  # in the keeper's last line when it stops restarting
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 8.0


def keeper_command(program: Sequence[str], max_restarts: int, label: str | None = None) -> tuple[str, ...]:
    """``program`` under a slot keeper that restarts it up to ``max_restarts`` times."""
    named = ("--label", label) if label else ()
    keeper = (sys.executable, "-m", "commlayer.launch.slot_keeper", "--max-restarts", str(max_restarts))
    return (*keeper, *named, "--", *program)


def backoff_seconds(restart: int) -> float:
    """The wait before restart ``restart`` (1-based): 0.5 s, doubling, at most 8 s."""
    return min(_MAX_BACKOFF_S, _FIRST_BACKOFF_S * 2 ** (restart - 1))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    label = args.label or f"rank {os.environ.get('RANK', '?')}"
    stopping = threading.Event()

    def stop(_signum: int, _frame: object) -> None:
        stopping.set()  # the member got the same signal through the process group

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)
    restart = 0
    while True:
        code, words = _run_member(args.program, restart)
        if code == 0 or stopping.is_set():
            return shell_code(code)
        what = describe_exit(code)
        if "lost" in words or restart >= args.max_restarts:
            why = " (no live member holds some shard of the state)" if "lost" in words else ""
            _say(
                f"{label} {GAVE_UP} {restart} restart{'' if restart == 1 else 's'} in its slot{why}: it {what}"
            )
            return shell_code(code)
        restart += 1
        wait = backoff_seconds(restart)
        _say(
            f"{label} {what}; restarting it in its slot in {wait:g}s (restart {restart} of {args.max_restarts})"
        )
        if stopping.wait(wait):
            return shell_code(code)


def _run_member(program: list[str], restart: int) -> tuple[int, set[str]]:
    """Run the member once; its exit code and the words it wrote on the channel."""
    reader, writer = os.pipe()
    env = {**os.environ, settings.FT_SLOT_RESTART.name: str(restart), settings.FT_CHANNEL.name: str(writer)}
    try:
        member = subprocess.Popen(
            program,
            env=env,
            pass_fds=(writer,),
            preexec_fn=child_setup(own_group=False),  # noqa: PLW1509 - PR_SET_PDEATHSIG needs it
        )
    finally:
        os.close(writer)
    words: set[str] = set()
    listener = threading.Thread(target=_listen, args=(reader, words), daemon=True)
    listener.start()
    code = member.wait()
    listener.join(timeout=1.0)
    return code, words


def _listen(reader: int, words: set[str]) -> None:
    with os.fdopen(reader, "rb") as channel:
        for line in channel:
            words.add(line.decode("ascii", errors="replace").strip())


def _say(line: str) -> None:
    print(f"commlayer run: {line}", file=sys.stderr, flush=True)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m commlayer.launch.slot_keeper")
    parser.add_argument("--max-restarts", type=int, required=True, help="restarts of the member at most")
    parser.add_argument("--label", default="", help="the member in messages (default: rank $RANK)")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS: the member")
    args = parser.parse_args(argv)
    args.program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not args.program or args.max_restarts < 0:
        parser.error("expected --max-restarts N >= 0 and '-- PROGRAM [ARGS]'")
    return args


if __name__ == "__main__":
    raise SystemExit(main())
