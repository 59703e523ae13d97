"""Public hooks: the typed call and handles (pure logic and wiring) and real 4-rank worlds: typed
arguments on every path, group hooks, the shipped recorder and logger, and the content-hash hook
naming a diverging data-parallel replica."""

from __future__ import annotations

import pytest
import torch

from commlayer import hooks
from commlayer.facade.calls import dispatch
from commlayer.hooks.content_hash import digest
from commlayer.testing import run_world

RANKS = "tests.observability.hooks_ranks"


def test_digest_sees_dtype_shape_and_every_byte() -> None:
    base = torch.arange(6, dtype=torch.float32)
    assert digest([base]) == digest([base.clone()])
    assert digest([base]) != digest([base.view(2, 3)])
    assert digest([base]) != digest([base.double()])
    changed = base.clone()
    changed[5] = torch.nextafter(changed[5], torch.tensor(10.0))
    assert digest([base]) != digest([changed])


def test_registering_installs_the_observer_and_removing_drops_it() -> None:
    assert dispatch._observer is None
    dispatch.plans[("sentinel",)] = None  # type: ignore[assignment]
    handle = hooks.register_pre_hook(lambda call: None)
    assert dispatch._observer is not None and not dispatch.plans
    dispatch.plans[("sentinel",)] = None  # type: ignore[assignment]
    handle.remove()
    assert dispatch._observer is None and not dispatch.plans
    handle.remove()  # twice is harmless


def test_bad_registrations_are_type_errors() -> None:
    with pytest.raises(TypeError, match="'fn' expected a callable"):
        hooks.register_pre_hook(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'group' expected a ProcessGroup"):
        hooks.register_post_hook(print, group="world")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_divergence"):
        hooks.content_hash(None, on_divergence="shout")  # type: ignore[arg-type]


@pytest.mark.multirank
def test_hooks_see_typed_calls_and_the_content_hash_names_the_diverging_replica() -> None:
    run_world(f"{RANKS}:every_check", 4, backend="gloo", timeout=120)


@pytest.mark.multirank
def test_content_hash_names_the_diverging_replica_on_shm() -> None:
    run_world(f"{RANKS}:diverging_replica", 4, backend="shm", timeout=120)
