"""ZeRO stages 0-3 on the mpi backend: the same equivalence as on gloo, in one mpirun world.

``run_world("tests.zero.zero_training_mpi_ranks:main", 2, backend="mpi", launcher="mpirun")``.
"""

from __future__ import annotations

import torch

from commlayer import dist

from . import zero_model as common
from .zero_training_ranks import RECIPE, check_equal, engine_for


def main() -> None:
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "mpi", dist.get_backend()
    expected, _ = common.reference_run(RECIPE)
    for stage in range(4):
        engine = engine_for(RECIPE, world, stage)
        common.train(engine, RECIPE, rank, world, range(RECIPE.steps))
        check_equal(engine.full_state_dict(), expected, f"mpi world {world} stage {stage} fp32")
