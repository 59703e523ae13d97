"""The one contract every backend implements.

A :class:`Backend` instance is one communicator over a group of ranks, like a c10d ProcessGroup.
Its mandatory core is small -- all_reduce, all_gather_into_tensor, broadcast, barrier, send, recv
and group creation -- and :class:`~commlayer.contract.fallbacks.GenericCollectives` builds every other
facade op on that core. The facade has already validated every argument against
:class:`~commlayer.core.types.Capabilities`, made every tensor contiguous and translated global ranks
into group ranks before a backend method runs, so a backend only talks to its library.

The rules, all of them:

- every op takes the keyword ``async_op`` (always passed) and returns a :class:`~commlayer.core.work.Work`;
- an untimed ``Work.wait()`` ends by the group's timeout: wrap a library request that has no
  deadline of its own in a :class:`~commlayer.core.work.DeadlineWork` subclass;
- a receive from any source (``recv_any``, when ``capabilities.recv_any_source``) returns a Work
  whose ``source_rank()`` is the sender's group rank;
- ``ReduceOp.AVG`` reaches the backend only if ``capabilities.native_avg``; otherwise the facade
  runs SUM and divides;
- anything not declared in ``capabilities`` is rejected by the facade with UnsupportedError;
- ``shrink`` (``dist.shrink_group``) runs on the survivors alone and never waits for an excluded
  rank; it ends within the new group's timeout.
- ``create_standalone`` builds a communicator from its members and the store alone, again and
  again in one process, independent of any other communicator; a backend that implements it sets
  ``builds_standalone``, one that does not leaves the default, which raises UnsupportedError.
- ``abort`` stops the communicator's outstanding ops on this rank alone (a peer may be dead) and
  returns without waiting for anyone; a backend whose ops run on a device until every peer
  arrives (NCCL kernels) starts ending them there, one whose ops run in the calling thread leaves
  the default.
- a backend whose library records torch.profiler events itself sets ``records_profiler_events``
  (the facade records one event per call for the others, see :mod:`commlayer.core.profiling`).
- ``window`` returns a one-sided window following :mod:`commlayer.contract.windows`; the
  default emulates one over ``send``/``recv`` (:class:`~commlayer.contract.emulated_windows.TwoSidedWindow`).
- a wait in native code releases the GIL, so that the flight-recorder watchdog
  (:mod:`commlayer.core.watchdog`) dumps this rank while it waits; a backend that ends the
  process itself (MPI_Abort) first calls ``watchdog.dump_now(reason)``.

Check a backend against all of it with the conformance kit, ``commlayer test-backend NAME -n 3``
(:mod:`commlayer.testing.conformance`); ``examples/plugin/`` is a complete third-party backend
that passes it.

Writing a backend (a third-party one looks exactly like the built-in ones)::

    class MyBackend(Backend):
        name = "mine"
        capabilities = Capabilities(devices=frozenset({"cpu"}))

        @classmethod
        def is_available(cls) -> Availability: ...
        @classmethod
        def create_world(cls, spec: GroupSpec) -> MyBackend: ...
        def new_group(self, spec: GroupSpec) -> MyBackend | None: ...
        def all_reduce(self, tensor, op, *, async_op): ...
        # ... and the other five core ops, each returning a commlayer.core.work.Work

and register it under the ``commlayer.backends`` entry-point group::

    [project.entry-points."commlayer.backends"]
    mine = "my_package.backend:MyBackend"
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from commlayer.contract.emulated_windows import TwoSidedWindow
from commlayer.contract.fallbacks import GenericCollectives
from commlayer.contract.fast_paths import FastPath
from commlayer.contract.windows import BackendWindow, WindowSpec
from commlayer.core.errors import UnsupportedError
from commlayer.core.flight_recorder import Recording
from commlayer.core.rendezvous import RendezvousInfo
from commlayer.core.types import Availability, Capabilities, GroupSpec, ReduceOp
from commlayer.core.work import Work

__all__ = ["Backend", "StandaloneOptions"]


@dataclass(frozen=True)
class StandaloneOptions:
    """How :meth:`Backend.create_standalone` builds its communicator.

    Args:
        mismatch_checks: whether the backend checks every op's signature across the group before
            issuing it (where it has such a check and its setting leaves it on). A caller whose
            members issue the same ops by construction, and which waits for each op itself (the
            check blocks the calling thread), turns it off.
    """

    mismatch_checks: bool = True


class Backend(GenericCollectives, ABC):
    """One communicator over ``spec.ranks``; every rank argument is a group rank.

    Args:
        spec: the group this communicator serves (see :class:`~commlayer.core.types.GroupSpec`).

    Example::

        >>> class Mine(Backend):
        ...     name = "mine"
        ...     capabilities = Capabilities(devices=frozenset({"cpu"}))
        ...     # is_available, create_world, new_group and the six core ops
    """

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    #: What to run when the backend is unavailable, e.g. ``pip install 'commlayer[mpi]'``.
    install_hint: ClassVar[str] = ""
    #: How a world of this backend is started: "local" processes with env:// variables, or "mpirun"
    #: (``commlayer test-backend`` and ``run_world`` callers use it).
    launcher: ClassVar[str] = "local"
    #: Whether the library records its own torch.profiler events (torch's ProcessGroups do); if
    #: not, the facade records one per call, named as torch names it, while a profiler runs.
    records_profiler_events: ClassVar[bool] = False
    #: Whether :meth:`create_standalone` is implemented (callers check it before communicating).
    builds_standalone: ClassVar[bool] = False

    def __init__(self, spec: GroupSpec) -> None:
        self.spec = spec

    @property
    def rank(self) -> int:
        """This process's rank inside the group (``spec.group_rank``)."""
        return self.spec.group_rank

    @property
    def size(self) -> int:
        """The number of ranks in the group."""
        return self.spec.size

    # --- lifecycle -------------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def is_available(cls) -> Availability:
        """Whether this backend can run here; when not, the reason and the fix."""

    @classmethod
    @abstractmethod
    def create_world(cls, spec: GroupSpec) -> Backend:
        """Build the communicator of every rank; called collectively by all ranks."""

    @classmethod
    def create_standalone(cls, spec: GroupSpec, options: StandaloneOptions) -> Backend:
        """Build a communicator over ``spec.ranks`` that is a world of its own; called by its
        members alone.

        Unlike :meth:`create_world` it touches no process-wide state (torch's default process
        group, a library's global world), so a process may build any number of them, over any
        members, one after another, while others exist or after a member of an earlier one died.
        Every member passes the same ``spec.name`` and ``spec.store``; the backend keeps its keys
        under ``spec.name`` and must not wait for anyone but the members. Store reads end at the
        store's timeout, ops at ``spec.timeout``. Such a communicator is used directly, never
        registered with the facade: its ``new_group`` and ``shrink`` need not work.

        The default raises UnsupportedError; a backend that implements it sets
        ``builds_standalone``.

        Args:
            spec: the members (this process is group rank ``spec.group_rank`` of the new
                communicator), the store, the timeout and the backend's own options.
            options: see :class:`StandaloneOptions`.
        """
        raise UnsupportedError(
            f"create_standalone: backend '{cls.name}' cannot build standalone communicators "
            f"(rank {spec.global_rank})"
        )

    @abstractmethod
    def new_group(self, spec: GroupSpec) -> Backend | None:
        """Build a subgroup over ``spec.ranks`` (global ranks).

        Called on the world communicator by *every* world rank, as torch's ``new_group`` is;
        returns None on ranks outside ``spec.ranks``. When ``spec.members_only`` is set, only the
        members call it (torch's own ``new_group`` on a ``"commlayer"`` world): a backend that
        cannot build a group from its members alone raises UnsupportedError.
        """

    def shrink(self, survivors: tuple[int, ...], spec: GroupSpec) -> Backend:
        """A fresh communicator over the ranks of this one that remain (``dist.shrink_group``).

        Called by the surviving ranks only, never by an excluded (possibly dead) one, so it must
        not talk to the excluded ranks or wait for them: build the new communicator from the
        survivors alone, through ``spec.store``. ``survivors`` are the kept ranks as ranks of
        this communicator, in the new group's order; ``spec`` describes the new communicator in
        the facade's numbering (renumbered 0..n-1 when the world itself shrinks, so a backend
        that talks to its library in its own numbering maps through ``survivors``). It must end
        within ``spec.timeout``, raising a typed error (CommTimeoutError) when a survivor does
        not join. A backend that cannot raises UnsupportedError saying why.

        The default builds the new communicator as a member-only group (``new_group`` with
        ``members_only``) on ``spec.store``, which every backend whose groups are built from
        the store alone supports.
        """
        return self.new_group(replace(spec, members_only=True))

    @classmethod
    def complete_rendezvous(cls, info: RendezvousInfo) -> RendezvousInfo:
        """Fill in what the job's fast path left out, using this backend's library.

        The facade calls it on the backend that matches the fast path (``mpi`` for a job that
        ``mpirun`` started without MASTER_ADDR/MASTER_PORT), before any store exists, on every
        rank. The default returns ``info`` unchanged.

        Args:
            info: what the fast path's environment variables said.

        Returns:
            ``info`` with the missing master address, port or local layout filled in.
        """
        return info

    def shutdown(self) -> None:
        """Release library resources; the facade calls it from destroy_process_group."""

    def abort(self) -> None:
        """Stop this communicator's outstanding ops without its peers; it is unusable after.

        Called on one rank alone, typically after a peer died mid-op (fault-tolerant training
        abandons a generation's communicators this way), so it must not wait for anyone. The
        default does nothing: ops that run in the calling thread are interrupted through
        :mod:`commlayer.core.health` instead.
        """

    def call_timeout(self, seconds: float) -> AbstractContextManager[None]:
        """Optional: bound every wait of this communicator by ``seconds`` while the context is open.

        The facade enters it around the start of a call made with ``timeout=``. A backend whose
        ops block in the calling thread before their Work exists (shm's run to completion) must
        lower its own deadline here, raising CommTimeoutError when it passes; one whose ops wait
        only in their Work needs nothing (the facade bounds that wait). The default does nothing.
        """
        return nullcontext()

    @property
    def torch_group(self) -> Any | None:
        """The ``torch.distributed`` ProcessGroup behind this communicator, if there is one."""
        return None

    def object_device(self) -> torch.device:
        """Where the object collectives stage their pickled bytes."""
        return torch.device("cpu")

    def plan(self, op: str, *fixed: Any) -> FastPath | None:
        """Optional: a fast path for ``op`` whose trailing arguments are ``fixed``
        (:mod:`commlayer.contract.fast_paths`).

        The facade calls it once per validated kind of call (see ``commlayer.facade.calls.dispatch``)
        and then calls ``run(async_op, *tensors)`` for every call of that kind: it must start
        ``getattr(self, op)(*tensors, *fixed)``, return its Work when ``async_op`` is true, and
        otherwise wait for it and return None. Tensors arrive contiguous but not flattened.
        None (the default) makes the facade build that fast path around the op itself.
        """
        return None

    def recorded_plan(self, op: str, fixed: tuple[Any, ...], recording: Recording) -> FastPath | None:
        """Optional: a fast path like :meth:`plan`'s that also enters every call in the
        group's flight recorder itself, as ``recording`` describes (its docstring lists the
        steps), saving the facade's recording wrapper: the hot path's cheapest form. A fast path
        written in Python gets those steps from ``recording.fast_path`` (or ``method_fast_path``).

        Tried before :meth:`plan`; None (the default) falls back to it.
        """
        return None

    # --- the mandatory core ----------------------------------------------------------------
    #
    # Every op takes the keyword ``async_op``, which the facade always passes: False when it will
    # wait for the op at once (a library with a cheaper blocking path may take it), True when the
    # caller gets the Work. Every op returns a Work; ``Work.wait()`` without a timeout must still
    # end by the group's timeout (``spec.timeout``) so that a peer that never arrives raises
    # instead of hanging -- :class:`~commlayer.core.work.DeadlineWork` does that for any library request
    # that can be tested. ``op`` is never AVG unless ``capabilities.native_avg``: the facade runs
    # SUM and divides.

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp, *, async_op: bool) -> Work:
        """Reduce ``tensor`` in place across the group with ``op``."""

    @abstractmethod
    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor, *, async_op: bool) -> Work:
        """``output`` holds ``size * tensor.numel()`` elements, rank-major."""

    @abstractmethod
    def broadcast(self, tensor: torch.Tensor, root: int, *, async_op: bool) -> Work:
        """Copy group rank ``root``'s ``tensor`` into every other rank's."""

    @abstractmethod
    def barrier(self, *, async_op: bool) -> Work:
        """Complete once every rank of the group has called it."""

    @abstractmethod
    def send(self, tensor: torch.Tensor, dst: int, tag: int, *, async_op: bool) -> Work:
        """Send ``tensor`` to group rank ``dst``; must not wait for the matching receive to post."""

    @abstractmethod
    def recv(self, tensor: torch.Tensor, src: int, tag: int, *, async_op: bool) -> Work:
        """Receive into ``tensor`` from group rank ``src``."""

    def recv_any(self, tensor: torch.Tensor, tag: int, *, async_op: bool = True) -> Work:
        """Receive from whichever rank sends first; the Work's ``source_rank()`` says who.

        Only called when ``capabilities.recv_any_source`` is True.
        """
        raise UnsupportedError(f"recv: backend '{self.name}' cannot receive from any source (src=None)")

    # --- one-sided windows -----------------------------------------------------------------

    def window(self, tensor: torch.Tensor, spec: WindowSpec) -> BackendWindow:
        """This rank's side of a new one-sided window over ``tensor``; collective over the group.

        ``tensor`` is contiguous and on a device the backend declares; ``spec`` says every rank's
        size. The rules the window follows are :mod:`commlayer.contract.windows`'s. The default
        emulates the window with this backend's ``send``/``recv``, so every backend has windows; a
        backend whose library has one-sided memory access (shared memory, MPI RMA, GPU peer
        mappings) overrides this to return its native window.
        """
        return TwoSidedWindow(self, self.spec.store, tensor, spec)
