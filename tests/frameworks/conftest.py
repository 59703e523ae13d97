"""The frameworks tier: each test needs its framework installed (``.ci/setup-frameworks``).

DeepSpeed compiles a CPU op on its first start in a process (``deepspeed_shm_comm``, which its
process group wrapper loads whether or not it is used); torch keeps the build in
``$TORCH_EXTENSIONS_DIR``, which defaults here to ``build/torch_extensions`` in the checkout, where
``.ci/setup-frameworks`` builds it once.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / "build" / "torch_extensions"))
