"""One-sided windows: rank 0 writes into rank 1's window and tells it so; every rank reads rank 2's.

Each rank registers a window of its own; ``put``, ``get`` and ``signal`` reach a peer's window
without the peer taking part, and ``fence`` completes every earlier put and get. Ranks are global
ranks, offsets and sizes count elements.

Run: commlayer run -n 3 examples/windows.py
Run: COMMLAYER_BACKEND=gloo commlayer run -n 3 examples/windows.py
"""

from __future__ import annotations

import torch

import commlayer
from commlayer import dist

dist.init_process_group()  # shm on the CPU; the second Run line emulates windows over gloo
rank = dist.get_rank()
win = commlayer.window(torch.full((8192,), float(rank)), group=None)  # collective
chunk = torch.arange(16.0)
if rank == 0:
    win.put(chunk, dst=1, offset=4096)  # offsets and sizes in elements; ranks are global
    win.signal(dst=1)
elif rank == 1:
    win.wait_signal(src=0, timeout=5)  # then win.tensor[4096:4112] holds chunk
    assert torch.equal(win.tensor[4096:4112], chunk), win.tensor[4096:4112]
out = torch.empty(4)
win.get(out, src=2, offset=0)
win.fence()  # collective: every earlier put/get is complete
assert torch.equal(out, torch.full((4,), 2.0)), out
win.free()
print(f"rank {rank}: read {out.tolist()} from rank 2's window")
dist.destroy_process_group()
