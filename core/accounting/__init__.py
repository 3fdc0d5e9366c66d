"""Privacy accounting: what central (epsilon, delta) shuffling n local reports gives.

The top of the privacy kernel (ADR 0027): the accountant, composition and the planner ask the
mechanisms (``deniable.core.mechanisms``) which analyses of ``deniable.core.amplification`` hold.
"""

from deniable.core.accounting.accountant import (
    all_bounds,
    analyses_for,
    best_bound,
    best_delta,
    central_guarantee,
    realised_probabilities,
)
from deniable.core.accounting.composition import (
    Guarantee,
    advanced_composition,
    basic_composition,
    best_composition,
    poisson_subsampling,
)
from deniable.core.accounting.planner import (
    Candidate,
    LaplaceBaseline,
    Plan,
    PlanningError,
    central_laplace,
    largest_epsilon0,
    plan,
)
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
    AmplificationBound,
    fmt21_closed_form,
    fmt21_closed_form_applicable,
)

__all__ = [
    "AmplificationBound",
    "Analysis",
    "BinaryRRExact",
    "Candidate",
    "FMT21ClosedForm",
    "FMT21NumericalClones",
    "GRRBlanket",
    "GRRFullBlanket",
    "Guarantee",
    "LaplaceBaseline",
    "NotApplicable",
    "Plan",
    "PlanningError",
    "advanced_composition",
    "all_bounds",
    "analyses_for",
    "basic_composition",
    "best_bound",
    "best_composition",
    "best_delta",
    "central_guarantee",
    "central_laplace",
    "fmt21_closed_form",
    "fmt21_closed_form_applicable",
    "largest_epsilon0",
    "plan",
    "poisson_subsampling",
    "realised_probabilities",
]
