"""Rank body of tests/observability/test_trace_folders.py: a few collectives on the world and a
subgroup, then a flight-recorder dump into the job's folder (COMMLAYER_TRACE_DIR/COMMLAYER_JOB_ID)."""

from __future__ import annotations

import torch

from commlayer import dist


def run() -> None:
    rank = dist.get_rank()
    tensor = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(tensor)
    dist.broadcast(tensor, 0)
    dist.all_gather_into_tensor(torch.zeros(8), torch.ones(4))
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(4))
    pair = dist.new_group([0, 1])
    dist.all_reduce(tensor, group=pair)
    path = dist.dump_flight_recorder(reason="test")
    assert path is not None and path.parent.name == "job-b", path


def dump_without_a_job_id() -> None:
    """A collective, then a dump: with no $COMMLAYER_JOB_ID, the job's folder is the agreed one."""
    tensor = torch.ones(4)
    dist.all_reduce(tensor)
    assert tensor.tolist() == [float(dist.get_world_size())] * 4, tensor
    dist.dump_flight_recorder(reason="test")


if __name__ == "__main__":  # under torchrun, which starts this file on every rank
    dist.init_process_group("gloo")
    dump_without_a_job_id()
    dist.destroy_process_group()
