"""The zero-change switch: torch groups asked for as gloo, nccl or no backend become commlayer's.

Frameworks that hard-code a backend name (Accelerate, transformers' Trainer, torchtitan, DeepSpeed's
defaults) call ``torch.distributed.init_process_group("gloo")`` or ``("nccl")`` themselves and check
the name against their own lists. With ``COMMLAYER_TORCH_TAKEOVER=1`` (``commlayer run
--torch-takeover`` sets it for every rank), the ``"commlayer"`` torch backend's entry point, which
torch runs at ``import torch``, calls :func:`install`. It wraps torch's ``init_process_group`` and
``new_group`` (in ``torch.distributed`` and ``torch.distributed.distributed_c10d``), and changes
exactly this: an ``init_process_group`` whose ``backend`` is None, ``"undefined"``, ``"gloo"``,
``"nccl"`` or a device list of those two (``"cpu:gloo,cuda:nccl"``) runs with
``backend="commlayer"``, so commlayer picks the backend of each device (``$COMMLAYER_BACKEND``,
else the accelerator's default); so does a ``new_group`` naming such a backend while torch's
default group is commlayer's (one naming none follows the default group anyway). Every other argument is passed on as given, every other name (mpi, xccl, commlayer,
plugins) is left alone, and the framework keeps its own record of the name it asked for
(Accelerate's ``state.backend``); ``torch.distributed.get_backend()`` answers ``"commlayer"``.

Unset, empty or ``0``, nothing is wrapped. :func:`uninstall` puts torch's functions back.
commlayer's own gloo and nccl backends build their torch groups inside :func:`torch_own`, which
the wrappers pass through untouched.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from commlayer.core import settings

__all__ = ["TAKEOVER_ENV", "enabled", "install", "installed", "taken_over", "torch_own", "uninstall"]

TAKEOVER_ENV = settings.TORCH_TAKEOVER.name
#: torch's names that the switch takes over; any other name is the caller's explicit choice.
TAKEN_NAMES = frozenset({"gloo", "nccl"})
_WRAPPED = ("init_process_group", "new_group")
_ORIGINAL = "commlayer_original"
_own = contextvars.ContextVar("commlayer_torch_own", default=False)


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``$COMMLAYER_TORCH_TAKEOVER`` turns the switch on."""
    return bool(settings.TORCH_TAKEOVER.value(environ))


def taken_over(backend: Any) -> bool:
    """Whether a torch call asking for ``backend`` runs on commlayer under the switch.

    >>> [taken_over(b) for b in (None, "gloo", "NCCL", "cpu:gloo,cuda:nccl", "mpi", "cuda:nccl,cpu:mpi")]
    [True, True, True, True, False, False]
    """
    if backend is None:
        return True
    text = str(backend).strip().lower()
    if text in ("", "undefined"):
        return True
    names = {item.partition(":")[2] if ":" in item else item for item in text.split(",")}
    return bool(names) and names <= TAKEN_NAMES


@contextlib.contextmanager
def torch_own() -> Iterator[None]:
    """torch calls made inside build torch's own groups, whatever the switch says."""
    token = _own.set(True)
    try:
        yield
    finally:
        _own.reset(token)


def install(*modules: ModuleType) -> None:
    """Wrap ``init_process_group`` and ``new_group`` of torch's distributed modules (idempotent)."""
    for module in modules or _torch_modules():
        for name in _WRAPPED:
            function = getattr(module, name)
            if not hasattr(function, _ORIGINAL):
                setattr(module, name, _redirecting(function))


def uninstall(*modules: ModuleType) -> None:
    """Put torch's own ``init_process_group`` and ``new_group`` back."""
    for module in modules or _torch_modules():
        for name in _WRAPPED:
            function = getattr(module, name)
            setattr(module, name, getattr(function, _ORIGINAL, function))


def installed() -> bool:
    """Whether torch's ``init_process_group`` is the switch's wrapper now."""
    import torch.distributed as torch_dist

    return hasattr(torch_dist.init_process_group, _ORIGINAL)


def _redirecting(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def redirected(*args: Any, **kwargs: Any) -> Any:
        if not _own.get():
            args, kwargs = _with_commlayer(function.__name__, args, kwargs)
        return function(*args, **kwargs)

    setattr(redirected, _ORIGINAL, function)
    return redirected


def _with_commlayer(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with ``backend="commlayer"`` when its backend is one the switch takes."""
    # init_process_group(backend, ...) takes it first; new_group(ranks, timeout, backend, ...) third.
    position = 0 if name == "init_process_group" else 2
    backend = args[position] if len(args) > position else kwargs.get("backend")
    if not taken_over(backend) or (name == "new_group" and not _new_group_taken(backend)):
        return args, kwargs
    if len(args) > position:
        return (*args[:position], "commlayer", *args[position + 1 :]), kwargs
    return args, {**kwargs, "backend": "commlayer"}


def _new_group_taken(backend: Any) -> bool:
    """A subgroup named gloo or nccl is commlayer's where torch's default group is; one without a
    backend follows the default group anyway."""
    import torch.distributed as torch_dist

    if backend is None or str(backend).strip().lower() in ("", "undefined"):
        return False
    return torch_dist.is_initialized() and torch_dist.get_backend() == "commlayer"


def _torch_modules() -> tuple[ModuleType, ...]:
    import torch.distributed as torch_dist
    import torch.distributed.distributed_c10d as c10d

    return (torch_dist, c10d)
