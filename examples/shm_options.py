"""The shm backend's options: the sizes of each rank's share of the group's segment, and how long a
wait spins before it yields the CPU.

Run: commlayer run -n 2 examples/shm_options.py
"""

import torch

from commlayer import dist
from commlayer.backends.shm import ShmOptions

dist.init_process_group("shm", pg_options=ShmOptions(small_bytes=64 * 1024, chunk_bytes=1 << 20, spins=256))
tensor = torch.ones(1 << 20)  # 4 MiB: staged through the 1 MiB chunks
dist.all_reduce(tensor)
assert torch.equal(tensor, torch.full_like(tensor, float(dist.get_world_size())))
dist.destroy_process_group()
