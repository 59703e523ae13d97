"""``commlayer run -n auto|gpu|cpu|N``: torchrun's spellings of how many ranks to start here.

``auto`` is one rank per GPU when there are GPUs, else one per CPU; ``gpu`` one per CUDA device
(an error when there is none); ``cpu`` one per CPU (``os.cpu_count()``); a number is itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["NPROC_CHOICES", "resolve_nproc"]

NPROC_CHOICES = ("auto", "gpu", "cpu")


def resolve_nproc(text: str, gpu_count: Callable[[], int] | None = None) -> int:
    """The number of ranks ``-n text`` asks for; ValueError for a spelling or a missing GPU."""
    if text.isdigit() and int(text) >= 1:
        return int(text)
    if text not in NPROC_CHOICES:
        raise ValueError(
            f"argument '-n' expected an integer >= 1, received {text!r} (or one of {', '.join(NPROC_CHOICES)})"
        )
    gpus = (gpu_count or _cuda_device_count)() if text != "cpu" else 0
    if text == "gpu" and gpus == 0:
        raise ValueError("argument '-n' expected GPUs for 'gpu', received a machine with no CUDA device")
    return gpus if gpus > 0 else os.cpu_count() or 1


def _cuda_device_count() -> int:
    import torch  # only -n auto|gpu pays for importing torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
