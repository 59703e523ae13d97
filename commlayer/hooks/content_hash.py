"""The content-hash hook: find the rank whose collective inputs differ from its replicas'.

Ranks that must hold the same data (data-parallel replicas fed the same batch and seed while
debugging a divergence, tensor-parallel ranks sharing a batch) form a *compare group*, e.g.
``mesh["dp"].group``. Registered, the hook hashes the inputs of every call (every ``every``-th
one) before it is started and gathers the hashes across the compare group; a rank whose hash
is not the majority's is named, in a :class:`ContentDivergenceError` raised on every rank of the
compare group before the call runs (``on_divergence="raise"``), or in a logged warning
(``"log"``). Every rank of the compare group must make the same hooked calls in the same order.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from commlayer import dist
from commlayer.core.errors import CommError
from commlayer.facade.groups.group import ProcessGroup
from commlayer.hooks.registry import CollectiveCall, RemovableHandle, register_pre_hook

__all__ = ["ContentDivergenceError", "ContentHashHook", "Divergence", "content_hash", "digest"]

log = logging.getLogger("commlayer.hooks")


class ContentDivergenceError(CommError):
    """Ranks that must agree passed different inputs to the same call; ``diverging`` names them."""

    def __init__(self, message: str, divergence: Divergence) -> None:
        super().__init__(message)
        self.divergence = divergence
        self.diverging = divergence.diverging


@dataclass(frozen=True)
class Divergence:
    """One disagreement: the call, the ranks whose hash differs from the majority's, and every hash."""

    op: str
    group: str
    seq: int
    compare_group: str
    diverging: tuple[int, ...]  # global ranks
    agreeing: tuple[int, ...]
    digests: tuple[tuple[int, str], ...]  # (global rank, hash)


def digest(tensors: Iterable[torch.Tensor]) -> str:
    """A hash of the tensors' dtypes, shapes and bytes (accelerator tensors are copied to the host)."""
    hasher = hashlib.blake2b(digest_size=8)
    for tensor in tensors:
        hasher.update(f"{tensor.dtype}{tuple(tensor.shape)};".encode())
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        hasher.update(data.view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()


class ContentHashHook:
    """See the module docstring; built by :func:`content_hash`."""

    def __init__(
        self,
        compare_group: ProcessGroup,
        watch: ProcessGroup | None,
        ops: frozenset[str] | None,
        every: int,
        on_divergence: str,
    ) -> None:
        self.compare_group = compare_group
        self.ops = ops
        self.every = every
        self.on_divergence = on_divergence
        self.checked = 0
        self.divergences: list[Divergence] = []
        self._seen = 0
        self.handle: RemovableHandle = register_pre_hook(self._check, watch)

    def _check(self, call: CollectiveCall) -> None:
        if self.ops is not None and call.op not in self.ops:
            return
        self._seen += 1
        if (self._seen - 1) % self.every:
            return
        if dist.get_rank(self.compare_group) < 0:
            return  # this rank is not in the compare group
        mine = digest(call.inputs) if call.inputs else None  # a receiving rank contributes nothing
        gathered: list[Any] = [None] * dist.get_world_size(self.compare_group)
        dist.all_gather_object(gathered, (call.rank, mine), group=self.compare_group)
        self.checked += 1
        divergence = _divergence(call, str(self.compare_group.name), gathered)
        if divergence is not None:
            self._report(call, divergence)

    def _report(self, call: CollectiveCall, divergence: Divergence) -> None:
        self.divergences.append(divergence)
        message = (
            f"content_hash: {call.op} #{call.seq} on group '{divergence.group}' ({call.dtype}, "
            f"{call.count} elements): the inputs of global rank(s) {list(divergence.diverging)} differ "
            f"from those of rank(s) {list(divergence.agreeing)} (compared across group "
            f"'{divergence.compare_group}'; hashes {dict(divergence.digests)}) (rank {call.rank})"
        )
        if self.on_divergence == "raise":
            raise ContentDivergenceError(message, divergence)
        log.warning("%s", message)

    def remove(self) -> None:
        self.handle.remove()

    def __enter__(self) -> ContentHashHook:  # noqa: PYI034 - py3.10 has no typing.Self
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


def _divergence(
    call: CollectiveCall, compare_group: str, gathered: list[tuple[int, str | None]]
) -> Divergence | None:
    """The ranks outside the most common hash (ties: the hash of the lowest rank wins)."""
    gathered = [(rank, value) for rank, value in gathered if value is not None]
    hashes = [value for _, value in gathered]
    if len(set(hashes)) <= 1:
        return None
    majority = max(hashes, key=lambda value: (hashes.count(value), -hashes.index(value)))
    return Divergence(
        op=call.op,
        group=call.group_name,
        seq=call.seq,
        compare_group=compare_group,
        diverging=tuple(rank for rank, value in gathered if value != majority),
        agreeing=tuple(rank for rank, value in gathered if value == majority),
        digests=tuple(gathered),
    )


def content_hash(
    compare_group: ProcessGroup,
    watch: ProcessGroup | None = None,
    ops: Iterable[str] | None = None,
    every: int = 1,
    on_divergence: Literal["raise", "log"] = "raise",
) -> ContentHashHook:
    """Hash each call's inputs and compare them across ``compare_group``, naming a diverging rank.

    Args:
        compare_group (ProcessGroup): ranks whose inputs must agree (e.g. ``mesh["dp"].group``).
        watch (ProcessGroup, optional): hook only this group's calls; None hooks every group.
        ops (list[str], optional): only these ops (e.g. ``["all_reduce"]``); None: every op.
        every (int, optional): check one call in ``every`` (the check is a collective).
        on_divergence (str, optional): ``"raise"`` a :class:`ContentDivergenceError` on every rank
            of ``compare_group`` before the call runs (default), or ``"log"`` a warning.

    Returns:
        The :class:`ContentHashHook`; ``hook.divergences`` lists what it found, ``hook.remove()``
        unregisters it.
    """
    if on_divergence not in ("raise", "log"):
        raise ValueError(
            f"content_hash: argument 'on_divergence' expected 'raise' or 'log', received {on_divergence!r}"
        )
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"content_hash: argument 'every' expected a positive int, received {every!r}")
    return ContentHashHook(
        compare_group, watch, None if ops is None else frozenset(ops), every, on_divergence
    )
