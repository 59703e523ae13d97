"""The comms logger: every collective's count, bytes and latency, per rank, and a Chrome trace.

Run: commlayer run -n 2 examples/comms_logger.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from commlayer import dist

dist.init_process_group()
trace = Path(tempfile.gettempdir()) / "commlayer-example-comms.json"

dist.comms_logger.enable(ops=["all_reduce", "all_gather"], verbose=False)
for _ in range(3):  # the training steps
    dist.all_reduce(torch.ones(1024))
    dist.all_gather([torch.empty(8) for _ in range(dist.get_world_size())], torch.ones(8))
table = dist.comms_logger.summary()  # collective: every rank calls it; rank 0 prints
dist.comms_logger.export_chrome_trace(trace)  # open in ui.perfetto.dev or chrome://tracing

assert set(table["ops"]) == {"all_reduce", "all_gather"}, table
dist.destroy_process_group()
