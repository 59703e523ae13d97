"""The comms logger: count, time and size every facade collective, per op and message size.

Enable it in code or from the environment::

    from commlayer import dist
    dist.comms_logger.enable(ops=["all_reduce", "all_gather"], verbose=False)
    ...                                   # train
    table = dist.comms_logger.summary()   # collective: every rank calls it; rank 0 prints
    dist.comms_logger.export_chrome_trace("comms.json")   # open in ui.perfetto.dev

    COMMLAYER_COMMS_LOGGER=1 [COMMLAYER_COMMS_LOGGER_OPS=all_reduce,broadcast]
    [COMMLAYER_COMMS_LOGGER_VERBOSE=1] [COMMLAYER_COMMS_LOGGER_TRACE=trace-{rank}.json] python train.py

How it measures: the facade hands every op's start to the observer set with
:func:`commlayer.facade.calls.dispatch.set_observer`. While enabled, the logger synchronises the
accelerator before the op starts and again when the op's Work completes, and records the time in
between; a blocking op is therefore timed exactly, an async one from its start until the caller's
``wait()`` (or ``is_completed()``) sees it done. Disabled, no observer is set and the facade pays
one ``is None`` test per call. Sizes are nccl-tests' S (see :mod:`commlayer.core.metrics`), so
busbw here matches ``commlayer bench``.

Stragglers: in a collective every rank finishes together, so a rank that *arrives* late spends
the least time inside it. In :func:`summary` the rank with the lowest mean latency is the likely
straggler, and the spread between ``avg_us_min`` and ``avg_us_max`` is the time others waited.
"""

from __future__ import annotations

from commlayer.comms_logger.logger import *
from commlayer.comms_logger.logger import __all__, enable_from_environment  # noqa: F401 - re-exports _logger's names

enable_from_environment()
