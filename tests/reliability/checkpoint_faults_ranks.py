"""A single process that trains a small ZeRO engine and saves checkpoints under one tag.

Run by tests/reliability/test_checkpoint_faults.py, which kills it inside a rename window of the
second save, widened here by sleeping at the tag's link switch: ``before_switch`` sleeps just
before the new link replaces the old one, ``after_switch`` just after (before the old version
is deleted)::

    python -m tests.reliability.checkpoint_faults_ranks DIR WINDOW SECONDS
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from unittest import mock

import torch.distributed as torch_dist

from commlayer import dist
from tests.zero import zero_model as common
from tests.zero.test_zero_engine import RECIPE, make_engine

TAG = "t"


def main(directory: str, window: str, seconds: str) -> None:
    dist.init_process_group(
        "gloo", store=torch_dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20)
    )
    engine = make_engine(2)
    common.train(engine, RECIPE, 0, 1, range(1))
    engine.save_checkpoint(directory, tag=TAG, client_state={"step": 1})
    print("SAVED", flush=True)
    common.train(engine, RECIPE, 0, 1, range(1, 2))
    print("SAVING", flush=True)
    with _widened(window, float(seconds)):
        engine.save_checkpoint(directory, tag=TAG, client_state={"step": 2})
    print("DONE", flush=True)
    dist.destroy_process_group()


@contextmanager
def _widened(window: str, seconds: float) -> Iterator[None]:
    """Sleep ``seconds`` in ``window`` of the tag's link switch (an ``os.replace`` onto the tag)."""
    replace: Callable[..., None] = os.replace

    def paused_replace(source: os.PathLike | str, target: os.PathLike | str) -> None:
        switching = Path(target).name == TAG
        if switching and window == "before_switch":
            time.sleep(seconds)
        replace(source, target)
        if switching and window == "after_switch":
            time.sleep(seconds)

    with mock.patch.object(os, "replace", paused_replace):
        yield


if __name__ == "__main__":
    main(*sys.argv[1:4])
