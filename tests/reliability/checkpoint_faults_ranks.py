"""A single process that trains a small ZeRO engine and saves checkpoints under one tag.

Run by tests/reliability/test_checkpoint_faults.py, which kills it inside a widened rename window
(``COMMLAYER_CHECKPOINT_TEST_PAUSE``)::

    python -m tests.reliability.checkpoint_faults_ranks DIR    # saves tag "t" at step 1, prints SAVED, then at step 2
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch.distributed as torch_dist

from commlayer import dist
from tests.zero import zero_model as common
from tests.zero.test_zero_engine import RECIPE, make_engine


def main(directory: str) -> None:
    dist.init_process_group(
        "gloo", store=torch_dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20)
    )
    engine = make_engine(2)
    common.train(engine, RECIPE, 0, 1, range(1))
    engine.save_checkpoint(directory, tag="t", client_state={"step": 1})
    print("SAVED", flush=True)
    common.train(engine, RECIPE, 0, 1, range(1, 2))
    print("SAVING", flush=True)
    engine.save_checkpoint(directory, tag="t", client_state={"step": 2})
    print("DONE", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
