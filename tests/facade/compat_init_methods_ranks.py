"""Rank body: the same world joins through tcp://, then file://, then an explicit store."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as torch_dist

from commlayer import dist


def main(tcp_port: str, store_port: str, file_path: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    for init_method in (f"tcp://127.0.0.1:{tcp_port}", f"file://{file_path}"):
        dist.init_process_group(
            "gloo", init_method=init_method, rank=rank, world_size=world, timeout=timedelta(seconds=60)
        )
        _check_sum(rank, world)
        dist.destroy_process_group()
    store = torch_dist.TCPStore(
        "127.0.0.1", int(store_port), world, is_master=rank == 0, timeout=timedelta(seconds=60)
    )
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    _check_sum(rank, world)
    dist.destroy_process_group()


def _check_sum(rank: int, world: int) -> None:
    assert (dist.get_rank(), dist.get_world_size()) == (rank, world)
    tensor = torch.tensor([rank + 1.0])
    dist.all_reduce(tensor)
    assert tensor.item() == world * (world + 1) / 2, tensor
