"""The planner page: target (ε, δ), n and domain in, every candidate mechanism out, and the
expected error against ε (the planner run at half, the same and twice the target)."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from deniable.admin.privacy import MAX_DOMAIN, MAX_N
from deniable.console import svg
from deniable.console.pages import Page
from deniable.console.tables import Table
from deniable.console.views import PLAN_COLUMNS, planner_rows

DEFAULT_MECHANISMS = ("grr", "oue", "olh")
"""Quick to plan (well under a second each); the form offers every registered mechanism."""


def parse_form(query: Mapping[str, str], mechanisms: list[str]) -> dict[str, Any]:
    """The form's values, checked; ValueError in one line for a bad one."""
    values: dict[str, Any] = {
        "target_epsilon": float(query.get("target_epsilon", "1")),
        "delta": float(query.get("delta", "1e-6")),
        "n": int(float(query.get("n", "10000"))),
        "domain": int(query.get("domain", "4")),
    }
    if not (math.isfinite(values["target_epsilon"]) and 0 < values["target_epsilon"] <= 20):
        raise ValueError("target ε must lie in (0, 20]")
    if not 0 < values["delta"] < 1:
        raise ValueError("δ must lie in (0, 1)")
    if not 1 <= values["n"] <= MAX_N:
        raise ValueError(f"n must lie in [1, {MAX_N:.0e}]")
    if not 2 <= values["domain"] <= MAX_DOMAIN:
        raise ValueError(f"the domain has 2 to {MAX_DOMAIN} values")
    values["mechanisms"] = tuple(mechanisms) or DEFAULT_MECHANISMS
    return values


@functools.lru_cache(maxsize=64)
def _candidates(
    eps: float, delta: float, n: int, domain: int, mechanisms: tuple[str, ...]
) -> tuple[Any, ...]:
    """Every candidate at one target (cached: the chart and the table share the runs)."""
    from deniable.core import mechanisms as registry
    from deniable.core.accounting.planner import best_configuration

    for name in mechanisms:
        registry.mechanism_class(name)  # ValueError naming the known ones
    return tuple(best_configuration(name, eps, delta, n, domain) for name in mechanisms)


async def plan_page(values: dict[str, Any]) -> Page:
    """The candidates at the target and the error-against-ε chart (planning runs in a thread)."""
    eps, delta, n, domain, mechanisms = (
        values["target_epsilon"],
        values["delta"],
        values["n"],
        values["domain"],
        values["mechanisms"],
    )
    grid = (eps / 2, eps, eps * 2)
    runs = await asyncio.gather(
        *(asyncio.to_thread(_candidates, e, delta, n, domain, mechanisms) for e in grid)
    )
    at_target = runs[1]
    series: dict[str, Sequence[tuple[float, float]]] = {
        name: [
            (e, c[i].expected_std_error if c[i].feasible else math.inf)
            for e, c in zip(grid, runs, strict=True)
        ]
        for i, name in enumerate(mechanisms)
    }
    chart = svg.line_chart(
        series,
        f"Expected error against target ε (n = {n}, k = {domain})",
        "target central ε",
        "expected std error per bucket (devices)",
    )
    table = Table(
        "candidates", f"Candidates at ε = {eps:g}, δ = {delta:g}", PLAN_COLUMNS, planner_rows(at_target)
    )
    body = form_html(values) + f"<h2>Candidates</h2>{table.html('/planner')}<figure>{chart}</figure>"
    return Page("Planner", body, (table,))


def form_html(values: Mapping[str, Any], error: str = "") -> str:
    """The planner form (GET: the result is a link; works from the keyboard, every field labelled)."""
    from deniable.core import mechanisms as registry

    err = f'<p class="warn" role="alert">{escape(error)}</p>' if error else ""
    fields = (
        (
            "p-eps",
            "target_epsilon",
            "Target central ε",
            values.get("target_epsilon", 1.0),
            'step="any" min="0.001"',
        ),
        ("p-delta", "delta", "δ", values.get("delta", 1e-6), 'step="any" min="0"'),
        ("p-n", "n", "n (devices per batch)", values.get("n", 10000), 'min="1"'),
        ("p-domain", "domain", "domain size k (2: binary)", values.get("domain", 4), 'min="2"'),
    )
    inputs = "".join(
        f'<p><label for="{i}">{label}</label> <input id="{i}" name="{name}" type="number"'
        f' value="{escape(str(v))}" {extra} required></p>'
        for i, name, label, v, extra in fields
    )
    chosen = set(values.get("mechanisms", DEFAULT_MECHANISMS))
    boxes = "".join(
        f'<label><input type="checkbox" name="mechanism" value="{escape(m)}"'
        f"{' checked' if m in chosen else ''}> {escape(m)}</label> "
        for m in registry.names()
    )
    return (
        f'{err}<form method="get" action="/planner">{inputs}<fieldset><legend>Mechanisms (slow ones take'
        f" minutes)</legend>{boxes}</fieldset>"
        '<p><button type="submit" name="plan" value="1">Plan</button></p></form>'
    )
