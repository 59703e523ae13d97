"""gloo's default mismatch check: a 32-byte signature reduction issued just before each collective.

gloo refuses a collective whose byte sizes differ between ranks, but not one whose dtypes of one
element size differ (rank 0 ``all_reduce(float32[4])`` against rank 1 ``all_reduce(int32[4])``
returns garbage, exit code 0, as in plain torch), nor different reduce ops or roots. So each
collective on a gloo group is preceded by an asynchronous ``allreduce(MAX)`` of its packed signature
(:mod:`._signature`) on the same ProcessGroup. gloo runs queued ops on several worker threads, so the
two overlap; the op's wait first waits for the signature and raises
:class:`~commlayer.errors.CollectiveMismatchError` on every rank when the ranks' calls differ,
before returning any data (and without waiting on a data op that a mismatch may leave hanging).
``COMMLAYER_GLOO_VERIFY=0`` turns it off; benchmarks/mismatch_check_overhead.py --gloo measures it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as torch_dist

from commlayer.errors import CollectiveMismatchError
from commlayer.work import Work

from ._signature import agree, dtype_codes, mismatch, pack
from ._torch_plans import options

__all__ = ["SignedProcessGroup", "SignedWork", "Signer", "verify_enabled"]

VERIFY_ENV = "COMMLAYER_GLOO_VERIFY"
_CHECKED_BY = f"Checked by the gloo backend beside the collective; {VERIFY_ENV}=0 turns the check off."
# Every dtype torch defines, numbered by name: the same on every rank of one torch version.
_CODES = dtype_codes(value for value in vars(torch).values() if isinstance(value, torch.dtype))
_MAX = options(torch_dist.AllreduceOptions, True, reduceOp=torch_dist.ReduceOp.MAX)


def verify_enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """False when ``COMMLAYER_GLOO_VERIFY`` is 0 (or false/off/no)."""
    return environ.get(VERIFY_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


class Signature:
    """One call's signature reduction in flight; :meth:`verify` waits for it and compares."""

    __slots__ = ("_error", "_values", "_work", "call", "count", "key", "signer")

    def __init__(self, signer: Signer, call: str, key: int, count: int) -> None:
        self.signer, self.call, self.key, self.count = signer, call, key, count
        self._values = torch.tensor((key, -key, count, -count), dtype=torch.int64)
        self._work: Any = signer.process_group.allreduce([self._values], _MAX)
        self._error: CollectiveMismatchError | None = None

    def verify(self, timeout: timedelta | None = None) -> None:
        """Raise CollectiveMismatchError (every time) if the ranks' calls differ.

        A signature reduction that fails for another reason (a dead peer) is left to the data
        op's own wait, which names the op; a timed wait that expires raises torch's timeout.
        """
        work = self._work
        if work is not None:
            try:
                work.wait() if timeout is None else work.wait(timeout)
            except RuntimeError as error:
                if timeout is not None and "timed out" in str(error).lower():
                    raise
            else:
                self._error = self._compare()
            self._work = None
        if self._error is not None:
            raise self._error

    def done(self) -> bool:
        return self._work is None or bool(self._work.is_completed())

    def _compare(self) -> CollectiveMismatchError | None:
        reduced = self._values.tolist()
        if agree(self.key, self.count, reduced):
            return None
        where = (self.signer.group, self.signer.rank)
        return mismatch(self.call, self.key, self.count, reduced, _CODES, where, _CHECKED_BY)


class Signer:
    """Starts the signature reduction of each call on one gloo ProcessGroup."""

    __slots__ = ("group", "process_group", "rank")

    def __init__(self, process_group: Any, group: str, rank: int) -> None:
        self.process_group, self.group, self.rank = process_group, group, rank

    def start(
        self, op: str, dtype: torch.dtype, count: int, root: int = -1, reduce_op: Any = None
    ) -> Signature:
        return Signature(self, op, pack(op, dtype, _CODES, root, reduce_op), count)


class SignedWork(Work):
    """A collective's Work that raises its signature's mismatch instead of returning the data."""

    def __init__(self, signature: Signature, data: Work) -> None:
        super().__init__(data.result())
        self._signature, self._data = signature, data

    def _test(self) -> bool:
        return self._signature.done() and self._data.is_completed()

    def _block(self, timeout_s: float | None) -> bool:
        self._signature.verify(None if timeout_s is None else timedelta(seconds=timeout_s))
        return self._data.wait(timeout_s)

    def _on_complete(self) -> None:
        self._signature.verify()
        self._data.wait()


class _SignedTorchWork:
    """The same for a torch Work, for the fused launchers (shaped like ``torch.distributed.Work``)."""

    __slots__ = ("_data", "_signature")

    def __init__(self, signature: Signature, data: Any) -> None:
        self._signature, self._data = signature, data

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._signature.verify(timeout)
        return bool(self._data.wait() if timeout is None else self._data.wait(timeout))

    def is_completed(self) -> bool:
        return self._signature.done() and bool(self._data.is_completed())

    def exception(self) -> Any:
        return self._data.exception()


class SignedProcessGroup:
    """The ProcessGroup methods the fused launchers call, each signed first (``_torch_plans``).

    ``op`` and ``fixed`` are the plan's (reduce op or root); the dtype comes from the tensors.
    """

    def __init__(self, signer: Signer, process_group: Any, op: str, fixed: Sequence[Any]) -> None:
        self._signer, self._pg = signer, process_group
        reduce_op = fixed[0] if op in ("all_reduce", "reduce_scatter_tensor") else None
        root = fixed[0] if op == "broadcast" else -1
        self._describe = (op, root, reduce_op)
        self.send, self.recv = process_group.send, process_group.recv  # point to point: unchecked

    def _sign(self, tensor: torch.Tensor, count: int) -> Signature:
        op, root, reduce_op = self._describe
        return self._signer.start(op, tensor.dtype, count, root, reduce_op)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> _SignedTorchWork:
        signature = self._sign(tensors[0], tensors[0].numel())
        return _SignedTorchWork(signature, self._pg.allreduce(tensors, opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> _SignedTorchWork:
        signature = self._sign(tensors[0], tensors[0].numel())
        return _SignedTorchWork(signature, self._pg.broadcast(tensors, opts))

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any) -> _SignedTorchWork:
        signature = self._sign(tensor, tensor.numel())
        return _SignedTorchWork(signature, self._pg._allgather_base(output, tensor, opts))

    def _reduce_scatter_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any) -> _SignedTorchWork:
        signature = self._sign(tensor, output.numel())
        return _SignedTorchWork(signature, self._pg._reduce_scatter_base(output, tensor, opts))

    def alltoall_base(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        opts: Any,
    ) -> _SignedTorchWork:
        # Uneven splits differ between ranks legitimately: only the dtype is compared then.
        signature = self._sign(tensor, 0 if out_splits or in_splits else tensor.numel())
        data = self._pg.alltoall_base(output, tensor, out_splits, in_splits, opts)
        return _SignedTorchWork(signature, data)
