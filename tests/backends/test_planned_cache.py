"""Pure logic: the C plan lookups' inline cache (csrc/facade_fast_paths/one_tensor.c).

``PlannedP2P`` and ``PlannedCollective`` answer a call whose key equals the last hit's without
building and hashing the key, for as long as the plans dict is unchanged. Every change to the
dict (a plan added or replaced, a clear) must send the next call back to the dict, and the cache
must not keep a group alive, and a tensor changed in place (another dtype, strides, size) must be
looked up again. Each test runs with the tensor read through its Python attributes and through
the C tensor reader (commlayer.core._tensor_meta). The two-tensor collectives' lookup
(``PlannedPaired``) reads tensors through the C reader only. Also the C entries of isend/irecv/send/recv (P2PEntry), which parse
as the Python functions do and fall back to them, and the fast_path's reuse of an evicted recorder
entry that nobody else holds.
"""

from __future__ import annotations

import gc
import inspect
import itertools
import weakref
from typing import Any

import pytest
import torch

from commlayer.backends import torch_fast_paths as _torch_plans
from commlayer.core import tensor_reader as _tensor_reader
from commlayer.core.flight_recorder import Recording
from commlayer.core.types import ReduceOp
from commlayer.facade.calls import plans as _plans

from ._tensor_kinds import PassThroughMode, Traced

native = _plans.native  # the facade's fast paths: the lookups and p2p entries
pytestmark = pytest.mark.skipif(
    native is None or _torch_plans.native is None, reason="the C fast path extensions are not built"
)
READERS = ["python attributes", "c tensor reader"]


@pytest.fixture(autouse=True, params=READERS)
def reader(request: pytest.FixtureRequest) -> Any:
    """Every test runs twice: tensors read through their Python attributes, and through the C
    tensor reader (commlayer.core._tensor_meta) where this torch has one built."""
    installed = _tensor_reader.tensor_meta_reader()
    if request.param == READERS[1] and installed is None:
        pytest.skip("no C tensor reader built for this torch")
    for extension in (native, _torch_plans.native):
        extension.set_tensor_meta(installed if request.param == READERS[1] else None)
    yield request.param
    for extension in (native, _torch_plans.native):
        extension.set_tensor_meta(installed)


class Group:
    """Stands for a commlayer ProcessGroup: hashable by identity, weakly referenceable."""


def _plan(name: str, seen: list) -> tuple:
    return (lambda async_op, tensor: seen.append((name, tensor)) or name,)


def _key(group: Any, tensor: torch.Tensor) -> tuple:
    return ("send", group, 1, 0, tensor.dtype, tensor.device, tensor.layout)


def test_every_change_to_the_plans_sends_the_next_call_back_to_the_dict() -> None:
    seen: list = []
    no_plan, tensor, group = object(), torch.ones(4), Group()
    plans: dict = {_key(group, tensor): _plan("first", seen)}
    planned = native.PlannedP2P(plans, "send", True, no_plan)
    assert [planned(tensor, 1, group, 0, None) for _ in range(3)] == ["first"] * 3
    plans[("another", "key")] = _plan("other", seen)  # a plan added elsewhere: still the same hit
    assert planned(tensor, 1, group, 0, None) == "first"
    plans[_key(group, tensor)] = _plan("second", seen)  # replaced under the same key
    assert planned(tensor, 1, group, 0, None) == "second"
    assert planned(tensor, 1, Group(), 0, None) is no_plan  # another group, an equal-looking call
    assert planned(tensor, 2, group, 0, None) is no_plan  # another peer
    assert planned(tensor, 1, group, 5, None) is no_plan  # another tag
    assert planned(tensor.double(), 1, group, 0, None) is no_plan  # another dtype
    assert planned(tensor, 1, group, 0, None) == "second"
    plans.clear()  # forget_plans(): the hit goes with the dict's entries
    assert planned(tensor, 1, group, 0, None) is no_plan
    assert [name for name, _ in seen] == ["first"] * 4 + ["second"] * 2


def test_the_cache_runs_the_plan_on_this_calls_tensor_and_refuses_what_the_key_cannot_vouch_for() -> None:
    seen: list = []
    no_plan, tensor, other = object(), torch.ones(4), torch.zeros(4)
    plans: dict = {_key(None, tensor): _plan("plan", seen)}
    planned = native.PlannedP2P(plans, "send", False, no_plan)
    assert planned(tensor, 1, None, 0, None) == "plan" and planned(other, 1, None, 0, None) == "plan"
    assert seen[1][1] is other
    assert planned(torch.ones(8)[::2], 1, None, 0, None) is no_plan  # same key, not contiguous
    assert planned(True, 1, None, 0, None) is no_plan  # not a tensor
    assert planned(tensor, True, None, 0, None) is no_plan  # True equals 1, but is not an int peer
    assert planned(tensor, 1, None, 0, 1) is no_plan  # group_dst given
    assert len(seen) == 2


def test_a_tensor_whose_metadata_changes_in_place_is_looked_up_again() -> None:
    seen: list = []
    no_plan, tensor, group = object(), torch.ones(4), Group()
    plans: dict = {_key(group, tensor): _plan("float", seen)}
    planned = native.PlannedP2P(plans, "send", True, no_plan)
    assert planned(tensor, 1, group, 0, None) == "float"
    tensor.data = torch.ones(4, dtype=torch.float64)  # the same Python tensor, another dtype
    assert planned(tensor, 1, group, 0, None) is no_plan
    tensor.data = torch.ones(4)
    assert planned(tensor, 1, group, 0, None) == "float"
    tensor.set_(torch.ones(8).untyped_storage(), 0, (4,), (2,))  # strided in place: staged
    assert planned(tensor, 1, group, 0, None) is no_plan
    tensor.set_(torch.ones(8).untyped_storage(), 0, (8,), (1,))  # contiguous again, resized
    assert planned(tensor, 1, group, 0, None) == "float"
    assert planned(torch.ones(4).to_sparse(), 1, group, 0, None) is no_plan  # another layout
    assert len(seen) == 3


def test_subclasses_and_torch_function_modes_are_asked_through_python() -> None:
    seen: list = []
    no_plan, tensor = object(), torch.ones(4)
    plans: dict = {_key(None, tensor): _plan("plan", seen)}
    planned = native.PlannedP2P(plans, "send", True, no_plan)
    assert planned(tensor.as_subclass(Traced), 1, None, 0, None) == "plan"
    with PassThroughMode():
        assert planned(tensor, 1, None, 0, None) == "plan"
    assert len(seen) == 2


def test_the_cache_holds_its_group_weakly() -> None:
    no_plan, tensor, group = object(), torch.ones(4), Group()
    plans: dict = {_key(group, tensor): _plan("plan", [])}
    planned = native.PlannedP2P(plans, "send", True, no_plan)
    assert planned(tensor, 1, group, 0, None) == "plan"
    held = weakref.ref(group)
    plans.clear()  # what destroying the group does
    del group
    gc.collect()
    assert held() is None


def test_the_collective_lookup_caches_by_reduce_op_too() -> None:
    seen: list = []
    no_plan, tensor = object(), torch.ones(4)
    key = ("all_reduce", None, ReduceOp.SUM, tensor.dtype, tensor.device, tensor.layout)
    plans: dict = {key: _plan("sum", seen)}
    planned = native.PlannedCollective(plans, "all_reduce", False, no_plan)
    assert planned(tensor, ReduceOp.SUM, None, False, None) == "sum"
    assert planned(tensor, ReduceOp.SUM, None, False, None) == "sum"
    assert planned(tensor, ReduceOp.MAX, None, False, None) is no_plan
    assert planned(tensor, ReduceOp.SUM, None, False, None) == "sum"
    assert len(seen) == 3


def _checked_recv(
    tensor: Any, src: Any = None, group: Any = None, tag: int = 0, group_src: Any = None
) -> Any:
    """Stands for the facade's Python recv: what the C entry falls back to."""
    return ("checked", tensor, src, group, tag, group_src)


def test_the_c_entry_parses_as_the_python_function_and_falls_back_to_it_unplanned() -> None:
    seen: list = []
    no_plan, tensor = object(), torch.ones(4)
    plans: dict = {("recv", None, 1, 3, tensor.dtype, tensor.device, tensor.layout): _plan("plan", seen)}
    recv = native.P2PEntry(native.PlannedP2P(plans, "recv", False, no_plan), _checked_recv, True)
    assert recv(tensor, 1, None, 3) == 1  # planned: recv answers its source
    assert recv(tensor, src=1, tag=3) == 1 and recv(tag=3, src=1, tensor=tensor) == 1
    assert len(seen) == 3
    assert recv(tensor, 1) == ("checked", tensor, 1, None, 0, None)  # tag 0: no plan
    assert recv(tensor, 1, tag=3, group_src=1) == ("checked", tensor, 1, None, 3, 1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dst'"):
        recv(tensor, dst=1)  # not this function's parameter: Python's own error
    with pytest.raises(TypeError, match="multiple values for argument 'src'"):
        recv(tensor, 1, src=1, tag=3)
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        recv(src=1, tag=3)
    assert len(seen) == 3


def test_the_c_entry_returns_the_plans_answer_and_carries_the_functions_documentation() -> None:
    no_plan, tensor = object(), torch.ones(4)
    plans: dict = {_key(None, tensor): (lambda async_op, t: ("work", async_op),)}
    isend = native.P2PEntry(native.PlannedP2P(plans, "send", True, no_plan), _checked_recv)
    assert isend(tensor, dst=1) == ("work", True)  # send's parameter names
    assert isend(tensor, src=1)[0] == "checked"  # not send's: the Python function decides
    from commlayer import dist

    assert dist.isend.__name__ == "isend" and dist.isend.__module__ == "commlayer.facade.ops.p2p"
    assert "Args:" in (dist.isend.__doc__ or "") and "group_dst" in str(inspect.signature(dist.isend))


def _recording_all_reduce(ring: list, first_seq: int) -> Any:
    """A C fast path of all_reduce over a no-op ProcessGroup method, entering its calls in ``ring``."""
    recording = Recording(
        itertools.count(first_seq).__next__, ring, len(ring), "all_reduce", torch.float32, -1, print
    )
    return _torch_plans.native.FastPath(
        0, lambda tensors, options: None, "sync", "async", 1, 7, 0, recording, _torch_plans.FastPathWork
    )


def test_an_evicted_recorder_entry_is_rewritten_only_when_nobody_else_holds_it() -> None:
    ring: list = [None] * 2
    fast_path = _recording_all_reduce(ring, first_seq=1)
    fast_path(False, torch.ones(2))  # seq 1 -> slot 1
    fast_path(False, torch.ones(2))  # seq 2 -> slot 0
    kept = ring[1]  # a reader's snapshot of the entry for seq 1
    fast_path(False, torch.ones(3))  # seq 3 evicts seq 1: a new entry, the snapshot is untouched
    assert kept[0] == 1 and kept[2] == torch.Size([2]) and ring[1] is not kept and ring[1][0] == 3
    unheld = id(ring[0])
    fast_path(False, torch.ones(4, 1))  # seq 4 evicts seq 2, which only the ring held: rewritten
    assert id(ring[0]) == unheld and ring[0][:4] == [4, "all_reduce", torch.Size([4, 1]), torch.float32]
    assert ring[0][5] == "completed" and not gc.is_tracked(ring[0])


def test_each_entry_holds_the_shape_its_tensor_had_when_called() -> None:
    ring: list = [None] * 8
    fast_path = _recording_all_reduce(ring, first_seq=0)
    tensor = torch.ones(2, 3)
    fast_path(False, tensor)
    fast_path(False, tensor)
    tensor.resize_(6)  # the same Python tensor, resized in place
    fast_path(False, tensor)
    fast_path(False, torch.ones(*range(1, 11)))  # more dimensions than the C reader takes
    assert [tuple(entry[2]) for entry in ring[:4]] == [(2, 3), (2, 3), (6,), tuple(range(1, 11))]


def _paired_key(kind: str, group: Any, output: torch.Tensor, tensor: torch.Tensor, *scalars: Any) -> tuple:
    described = (output.dtype, output.device, output.layout, tensor.dtype, tensor.device, tensor.layout)
    return (kind, group, *scalars, *described)


def _paired_plan(name: str, seen: list, size: int) -> tuple:
    return (lambda async_op, *arguments: seen.append((name, arguments)) or name, None, size)


def test_the_paired_lookup_runs_plans_whose_counts_fit_and_refuses_the_rest(reader: str) -> None:
    seen: list = []
    no_plan, group = object(), Group()
    output, tensor = torch.zeros(8), torch.ones(4)
    plans: dict = {
        _paired_key("all_gather_into_tensor", group, output, tensor): _paired_plan("gather", seen, 2)
    }
    gather = native.PlannedPaired(plans, "all_gather_into_tensor", 0, no_plan)
    if reader == READERS[0]:  # it reads tensors through the C reader only: Python's lookup serves all
        assert gather(output, tensor, group, False, None, None) is no_plan and not seen
        return
    assert [gather(output, tensor, group, False, None, None) for _ in range(2)] == ["gather"] * 2
    assert gather(torch.zeros(6), tensor, group, False, None, None) is no_plan  # 6 != 2 x 4
    assert gather(torch.zeros(16)[::2], tensor, group, False, None, None) is no_plan  # strided
    assert gather(output, tensor.double(), group, False, None, None) is no_plan  # another dtype
    assert gather(output, tensor, Group(), False, None, None) is no_plan  # another group
    assert gather(output.as_subclass(Traced), tensor, group, False, None, None) is no_plan  # Python decides
    tensor.data = torch.ones(4, dtype=torch.float64)  # the same Python tensor, another dtype
    assert gather(output, tensor, group, False, None, None) is no_plan
    plans.clear()
    assert gather(output, torch.ones(4), group, False, None, None) is no_plan
    assert [name for name, _ in seen] == ["gather"] * 2


def test_the_paired_lookup_keys_reduce_scatter_by_its_op_and_all_to_all_by_even_splits(reader: str) -> None:
    if reader == READERS[0]:
        return  # the test above shows that without the C reader every call is the Python lookup's
    seen: list = []
    no_plan, output, tensor = object(), torch.zeros(2), torch.ones(6)
    plans: dict = {
        _paired_key("reduce_scatter_tensor", None, output, tensor, ReduceOp.SUM): _paired_plan(
            "sum", seen, 3
        ),
        _paired_key("all_to_all_single", None, tensor, tensor): _paired_plan("a2a", seen, 3),
    }
    scatter = native.PlannedPaired(plans, "reduce_scatter_tensor", 1, no_plan)
    exchange = native.PlannedPaired(plans, "all_to_all_single", 2, no_plan)
    assert scatter(output, tensor, None, True, ReduceOp.SUM, None) == "sum"
    assert scatter(output, tensor, None, True, ReduceOp.MAX, None) is no_plan
    assert exchange(tensor, tensor, None, False, None, None) == "a2a"
    assert seen[-1] == ("a2a", (tensor, tensor, None, None))  # the plan's even-split call
    assert exchange(tensor, tensor, None, False, [1, 2, 3], [3, 2, 1]) is no_plan  # splits: Python
    assert exchange(torch.ones(4), torch.ones(4), None, False, None, None) is no_plan  # 4 rows, 3 ranks
    assert [name for name, _ in seen] == ["sum", "a2a"]
