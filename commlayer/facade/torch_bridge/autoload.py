"""Entry point of torch's ``torch.backends`` group: torch runs it at ``import torch``.

It makes ``torch.distributed.init_process_group("commlayer")`` work in scripts that never import
commlayer, also under ``mpirun``/``srun``: torch's env:// rendezvous reads RANK and WORLD_SIZE,
which MPI launchers do not set, so when a launcher's own variables and MASTER_ADDR/MASTER_PORT
are present and RANK is not, the launcher's are copied into torch's names. Without a master
address nothing changes: commlayer's own init then exchanges one over MPI, as it always did.
With ``COMMLAYER_TORCH_TAKEOVER=1`` it also turns on the zero-change switch
(:mod:`commlayer.contract.takeover`). It must never break ``import torch``: any failure is only
logged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping

__all__ = ["fill_torch_launcher_variables", "register"]


def register() -> None:
    """Register the ``"commlayer"`` backend with torch.distributed, lazily importing the bridge."""
    try:
        fill_torch_launcher_variables(os.environ)
        import torch.distributed as torch_dist

        if not torch_dist.is_available():
            return
        if "COMMLAYER" not in torch_dist.Backend._plugins:
            torch_dist.Backend.register_backend(
                "commlayer", _create, extended_api=True, devices=["cpu", "cuda"]
            )
        from commlayer.contract import takeover

        if takeover.enabled():
            takeover.install()
    except Exception as error:  # noqa: BLE001 - see the module docstring
        logging.getLogger("commlayer").debug("commlayer: torch backend not registered: %s", error)


def fill_torch_launcher_variables(environ: MutableMapping[str, str]) -> None:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from an MPI/SLURM launcher's variables.

    Nothing changes when RANK is already set (torchrun, ``commlayer run``), when MASTER_ADDR or
    MASTER_PORT is missing (env:// could not use them), or when no launcher is found.
    """
    from commlayer.core.rendezvous import discover

    if "RANK" in environ or "MASTER_ADDR" not in environ or "MASTER_PORT" not in environ:
        return
    try:
        info = discover(environ)
    except ValueError:  # RendezvousEnvError: commlayer's own init reports those clearly
        return
    if info is None:
        return
    environ["RANK"], environ["WORLD_SIZE"] = str(info.rank), str(info.world_size)
    environ["LOCAL_RANK"], environ["LOCAL_WORLD_SIZE"] = str(info.local_rank), str(info.local_world_size)


def _create(options: object, backend_options: object) -> object:
    from commlayer.facade.torch_bridge import (
        groups as torch_bridge,  # importing it registers the real creator too
    )

    return torch_bridge._create_from_torch(options, backend_options)
