"""The one contract every backend implements.

A :class:`Backend` instance is one communicator over a group of ranks, like a c10d ProcessGroup.
Its mandatory core is small -- all_reduce, all_gather_into_tensor, broadcast, barrier, send, recv
and group creation -- and :class:`~commlayer.fallbacks.GenericCollectives` builds every other
facade op on that core. The facade has already validated every argument, made every tensor
contiguous and translated global ranks into group ranks before a backend method runs, so a
backend only talks to its library.

Writing a backend (a third-party one looks exactly like the built-in ones)::

    class MyBackend(Backend):
        name = "mine"
        capabilities = Capabilities(devices=frozenset({"cpu"}))

        @classmethod
        def is_available(cls) -> Availability: ...
        @classmethod
        def create_world(cls, spec: GroupSpec) -> MyBackend: ...
        def new_group(self, spec: GroupSpec) -> MyBackend | None: ...
        # ... the six core ops, each returning a commlayer.work.Work

and register it under the ``commlayer.backends`` entry-point group::

    [project.entry-points."commlayer.backends"]
    mine = "my_package.backend:MyBackend"
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from .errors import UnsupportedError
from .fallbacks import GenericCollectives
from .types import Availability, Capabilities, GroupSpec, ReduceOp
from .work import Work

__all__ = ["Backend"]


class Backend(GenericCollectives, ABC):
    """One communicator over ``spec.ranks``; every rank argument is a group rank."""

    name: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    #: What to run when the backend is unavailable, e.g. ``pip install 'commlayer[mpi]'``.
    install_hint: ClassVar[str] = ""

    def __init__(self, spec: GroupSpec) -> None:
        self.spec = spec

    @property
    def rank(self) -> int:
        return self.spec.group_rank

    @property
    def size(self) -> int:
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

    @abstractmethod
    def new_group(self, spec: GroupSpec) -> Backend | None:
        """Build a subgroup over ``spec.ranks`` (global ranks).

        Called on the world communicator by *every* world rank, as torch's ``new_group`` is;
        returns None on ranks outside ``spec.ranks``.
        """

    def shutdown(self) -> None:
        """Release library resources; the facade calls it from destroy_process_group."""

    @property
    def torch_group(self) -> Any | None:
        """The ``torch.distributed`` ProcessGroup behind this communicator, if there is one."""
        return None

    def object_device(self) -> torch.device:
        """Where the object collectives stage their pickled bytes."""
        return torch.device("cpu")

    def plan(self, op: str, *fixed: Any) -> Callable[..., Work | None] | None:
        """Optional: a fused launcher for ``op`` whose trailing arguments are ``fixed``.

        The facade calls it once per validated kind of call (see ``commlayer.dist._dispatch``)
        and then calls ``run(async_op, *tensors)`` for every call of that kind: it must start
        ``getattr(self, op)(*tensors, *fixed)``, return its Work when ``async_op`` is true, and
        otherwise wait for it and return None. Tensors arrive contiguous but not flattened.
        None (the default) makes the facade build that launcher around the op itself.
        """
        return None

    # --- the mandatory core ----------------------------------------------------------------
    #
    # Every op returns a Work. ``Work.wait()`` without a timeout must still end by the group's
    # timeout (``spec.timeout``) when the library has no deadline of its own, so that a peer
    # that never arrives raises instead of hanging.

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOp) -> Work: ...

    @abstractmethod
    def all_gather_into_tensor(self, output: torch.Tensor, tensor: torch.Tensor) -> Work:
        """``output`` holds ``size * tensor.numel()`` elements, rank-major."""

    @abstractmethod
    def broadcast(self, tensor: torch.Tensor, root: int) -> Work: ...

    @abstractmethod
    def barrier(self) -> Work: ...

    @abstractmethod
    def send(self, tensor: torch.Tensor, dst: int, tag: int) -> Work: ...

    @abstractmethod
    def recv(self, tensor: torch.Tensor, src: int, tag: int) -> Work: ...

    def recv_any(self, tensor: torch.Tensor, tag: int) -> Work:
        """Receive from whichever rank sends first; the Work's ``source_rank()`` says who."""
        raise UnsupportedError(f"recv: backend '{self.name}' cannot receive from any source (src=None)")
