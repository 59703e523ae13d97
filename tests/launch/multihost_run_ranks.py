"""A rank program for `commlayer run --hostfile` tests (tests/launch/test_multihost_run.py).

    python hosts_world.py check EXPECTED_EXPORT      every rank joins a gloo world and checks it
    python hosts_world.py kill RANK MARK_FILE        RANK SIGKILLs itself inside the world; the others block
    python hosts_world.py signals FOLDER             every rank says ready, then records the signal it gets

Only the modes that need a world import torch (the signal checks start instantly).

``check`` asserts the launcher's variables, that the exported COMMLAYER_TEST_EXPORT arrived, and an
exact all_reduce, then prints ``ok RANK HOSTNAME``.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path


def check(expected_export: str) -> None:
    import torch

    from commlayer import dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, world
    # The agent's torchrun-style variables. Under mpirun, commlayer's torch autoload copies only
    # MPI's RANK/WORLD_SIZE/LOCAL_* (commlayer.facade.torch_bridge.autoload), never torchrun's GROUP_RANK.
    under_mpi = "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ
    if "RANK" in os.environ and not under_mpi:
        assert rank == int(os.environ["RANK"]) and os.environ["WORLD_SIZE"] == "4"
        assert int(os.environ["LOCAL_RANK"]) == rank % 2 and os.environ["LOCAL_WORLD_SIZE"] == "2"
        assert os.environ["GROUP_RANK"] == str(rank // 2), os.environ.get("GROUP_RANK")
    assert os.environ.get("COMMLAYER_TEST_EXPORT") == expected_export, os.environ.get("COMMLAYER_TEST_EXPORT")
    values = torch.tensor([rank + 1.0, 10.0 * rank])
    dist.all_reduce(values)
    assert values.tolist() == [10.0, 60.0], values
    dist.destroy_process_group()
    print(f"ok {rank} {socket.gethostname()}")


def kill(victim: str, mark_file: str) -> None:
    from commlayer import dist

    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == int(victim):
        Path(mark_file).write_text(f"{time.time():.6f}", encoding="ascii")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(600)  # the launcher must stop us


def signals(folder: str) -> None:
    rank = os.environ["RANK"]

    def record(signum: int, _frame: object) -> None:
        Path(folder, f"rank{rank}.{signal.Signals(signum).name}").write_text(
            socket.gethostname(), encoding="ascii"
        )
        sys.exit(0)

    signal.signal(signal.SIGINT, record)
    signal.signal(signal.SIGTERM, record)
    print(f"ready {rank}", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    {"check": check, "kill": kill, "signals": signals}[sys.argv[1]](*sys.argv[2:])
