"""Amplification-by-shuffling mathematics: analyses, protocol theorems and the tightest bound.

The bottom of the privacy kernel (ADR 0027): imports nothing of ``deniable.core.mechanisms`` or
``deniable.core.accounting``; mechanisms declare which of these analyses hold for them.
"""

from deniable.core.amplification.analyses import (
    Analysis,
    BinaryRRExact,
    FMT21ClosedForm,
    FMT21NumericalClones,
    GRRBlanket,
    GRRFullBlanket,
    NotApplicable,
)
from deniable.core.amplification.shuffle import (
    LOCAL_ONLY,
    AmplificationBound,
    fmt21_closed_form,
    fmt21_closed_form_applicable,
)
from deniable.core.amplification.tightest import (
    MAX_EPSILON0,
    DeclaredAnalyses,
    generic_analyses,
    tightest_bound,
    tightest_delta,
)

__all__ = [
    "LOCAL_ONLY",
    "MAX_EPSILON0",
    "AmplificationBound",
    "Analysis",
    "BinaryRRExact",
    "DeclaredAnalyses",
    "FMT21ClosedForm",
    "FMT21NumericalClones",
    "GRRBlanket",
    "GRRFullBlanket",
    "NotApplicable",
    "fmt21_closed_form",
    "fmt21_closed_form_applicable",
    "generic_analyses",
    "tightest_bound",
    "tightest_delta",
]
