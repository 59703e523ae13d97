"""The mpi backend's options: the mode its collectives run in, and its mismatch check.

Run: mpirun -n 2 python examples/mpi_options.py
"""

import torch

from commlayer import dist
from commlayer.backends.mpi import MpiOptions

dist.init_process_group("mpi", pg_options=MpiOptions("requests", verify=True))
tensor = torch.ones(4)
dist.all_reduce(tensor)
assert torch.equal(tensor, torch.full((4,), float(dist.get_world_size()))), tensor
dist.destroy_process_group()
