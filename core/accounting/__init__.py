"""Privacy accounting: what central (epsilon, delta) shuffling n local reports gives."""

from deniable.core.accounting.shuffle import (
    AmplificationBound,
    central_guarantee,
    fmt21_closed_form,
    fmt21_closed_form_applicable,
)

__all__ = [
    "AmplificationBound",
    "central_guarantee",
    "fmt21_closed_form",
    "fmt21_closed_form_applicable",
]
