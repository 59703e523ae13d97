"""The conformance kit: the suite every commlayer backend, built-in or third-party, must pass.

``commlayer test-backend NAME -n 3`` runs it on any installed backend and prints a certificate
table (op x dtype x ReduceOp, each cell over WORLD and a subgroup, sync and async). From a test::

    from commlayer.testing import run_world

    run_world("commlayer.testing.conformance:main", 3, backend="mine")

:mod:`.values` holds the deterministic per-rank inputs and exact expectations the suite uses, for
backend authors' own checks.
"""

from __future__ import annotations

from commlayer.testing.conformance.case import Case
from commlayer.testing.conformance.certificate import FAIL, PASS, UNSUPPORTED, Cell, Certificate, Verdict
from commlayer.testing.conformance.suite import main, run_suite
from commlayer.testing.conformance.values import (
    DTYPES,
    NUMEL,
    NUMERIC_DTYPES,
    assert_equal,
    ops_for,
    reduced,
    values,
)

__all__ = [
    "DTYPES",
    "FAIL",
    "NUMEL",
    "NUMERIC_DTYPES",
    "PASS",
    "UNSUPPORTED",
    "Case",
    "Cell",
    "Certificate",
    "Verdict",
    "assert_equal",
    "main",
    "ops_for",
    "reduced",
    "run_suite",
    "values",
]
