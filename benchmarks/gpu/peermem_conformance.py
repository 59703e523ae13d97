"""The conformance suite on the default CUDA backend, one torchrun world, with a hang report.

    torchrun --standalone --nproc-per-node N benchmarks/gpu/peermem_conformance.py OUT_DIR

Each rank rewrites OUT_DIR/rank<N>.certificate.json after every check; a rank still running after
140 s prints every thread's stack and exits, so a hang names its check.
"""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path

import torch

from commlayer import dist
from commlayer.testing.conformance.suite import run_suite

out = Path(sys.argv[1])
faulthandler.dump_traceback_later(140, exit=True)
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group()
certificate = run_suite(save_to=out / f"rank{dist.get_rank()}.certificate.json")
failures = certificate.failures()
print(f"rank {dist.get_rank()}: {dist.get_backend()}: {len(failures)} failed cells")
for verdict in failures[:20]:
    print(f"  {verdict.cell.label}: {verdict.detail}")
dist.destroy_process_group()
