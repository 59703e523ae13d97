"""Rank code of test_profiler: the same calls on raw torch.distributed (gloo) and on commlayer,
each under torch.profiler, with the events and results compared.

The reference is torch's default group, initialised over a FileStore (``path``) beside the
commlayer world; on commlayer's gloo backend, which owns torch's default group, it is a torch
gloo group of its own. Every rank contributes distinct values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as torch_dist
from torch.profiler import ProfilerActivity, profile

from commlayer import dist
from commlayer.core import profiling
from tests.facade.torch_fidelity_ranks import torch_reference


def main(path: str) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    reference = torch_reference(path)
    torch_events, torch_results = _profiled(lambda: _calls(torch_dist, reference, rank, size))
    events, results = _profiled(lambda: _calls(dist, None, rank, size))
    assert len(results) == len(torch_results)
    for index, (ours, theirs) in enumerate(zip(results, torch_results)):
        assert torch.equal(ours, theirs), (index, ours, theirs)
    _compare(backend, events, torch_events)
    assert not profiling.active
    # A second profiler, through torch's older API: plans rebuilt after the first one stopped.
    with torch.autograd.profiler.profile(record_shapes=True) as second:
        dist.all_reduce(torch.arange(3.0) + rank)
    assert [e.name for e in second.function_events if e.name.startswith("c10d::")] == ["c10d::allreduce_"]
    if torch_dist.is_initialized() and reference is None:
        torch_dist.destroy_process_group()


def _profiled(calls: Callable[[], list[torch.Tensor]]) -> tuple[list[Any], list[torch.Tensor]]:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        results = calls()
    assert not profiling.active
    return list(prof.events()), results


def _calls(d: Any, group: Any, rank: int, size: int) -> list[torch.Tensor]:
    """The calls each API profiles; returns every result, for the exact comparison."""
    base = torch.arange(4.0) + 10 * rank
    summed, maxed, sent = base.clone(), base.clone(), base.clone()
    d.all_reduce(summed, group=group)
    d.all_reduce(maxed, op=d.ReduceOp.MAX, group=group)
    d.broadcast(sent, src=1, group=group)
    gathered = torch.zeros(4 * size)
    d.all_gather_into_tensor(gathered, base, group=group)
    scattered = torch.zeros(2)
    d.reduce_scatter_tensor(scattered, torch.arange(2.0 * size) * (rank + 1), group=group)
    exchanged = torch.zeros(2 * size)
    d.all_to_all_single(exchanged, torch.arange(2.0 * size) + 100 * rank, group=group)
    listed = [torch.zeros(4) for _ in range(size)]
    d.all_gather(listed, base, group=group)
    reduced = base.clone()
    d.reduce(reduced, dst=0, group=group)
    d.barrier(group=group)
    waited = base.clone()
    d.all_reduce(waited, group=group, async_op=True).wait()
    peer = torch.full((3,), float(rank))
    if rank == 0:
        d.send(peer + 5, dst=1, group=group)
    elif rank == 1:
        d.recv(peer, src=0, group=group)
    pair = [base.clone(), torch.arange(3.0) * (rank + 1)]
    d.all_reduce_coalesced(pair, group=group)
    later = [base.clone(), torch.arange(2.0) - rank]
    d.all_reduce_coalesced(later, op=d.ReduceOp.MAX, group=group, async_op=True).wait()
    pairs = [[torch.zeros(4), torch.zeros(3)] for _ in range(size)]
    d.all_gather_coalesced(pairs, [base, torch.arange(3.0) - rank], group=group)
    results = [summed, maxed, sent, gathered, scattered, exchanged, *listed, waited, peer, *pair, *later]
    results += [tensor for row in pairs for tensor in row]
    return results + ([reduced] if rank == 0 else [])


def _compare(backend: str, events: list[Any], torch_events: list[Any]) -> None:
    names = [e.name for e in events if e.name.startswith("c10d::")]
    torch_names = [e.name for e in torch_events if e.name.startswith("c10d::")]
    assert names == torch_names, (backend, names, torch_names)
    if backend == "gloo":  # torch's own ProcessGroup: every event exactly as torch's
        assert _shaped(events) == _shaped(torch_events), (_shaped(events), _shaped(torch_events))
        assert _exact(events) == _exact(torch_events), (_exact(events), _exact(torch_events))
        return
    for e in events:
        if e.name.startswith("c10d::"):
            keywords = e.kwinputs
            assert set(keywords) == {"op", "group", "dtype", "size"}, (e.name, keywords)
            assert keywords["group"] == dist.group.WORLD.group_name, keywords
            if e.name != "c10d::barrier":
                assert keywords["dtype"] == "torch.float32" and keywords["size"] > 0, (e.name, keywords)
                assert e.input_shapes and all(e.input_shapes), (e.name, e.input_shapes)
    # shm sends point to point over a gloo group of its own: that library's events may show.
    internal = [
        e.name for e in events if e.name.startswith("gloo:") and e.name not in ("gloo:send", "gloo:recv")
    ]
    assert not internal, (backend, _shaped(events))


def _exact(events: list[Any]) -> list[tuple[Any, ...]]:
    """What a profiler shows of each coalesced call's events: name, shapes, scalar arguments
    (asyncOp among them), keyword inputs, whether it is async, its scope (the event after each
    coalesced dispatcher op is its gloo event)."""
    picked = [i for i, e in enumerate(events) if "coalesced" in e.name]
    picked = sorted({j for i in picked for j in (i, i + 1) if j < len(events)})
    return [
        (e.name, e.input_shapes, e.concrete_inputs, dict(e.kwinputs), e.is_async, e.scope)
        for e in (events[i] for i in picked)
    ]


def _shaped(events: list[Any]) -> list[tuple[str, Any]]:
    return [(e.name, e.input_shapes) for e in events if e.name.startswith(("c10d::", "gloo:"))]
