"""Each page built from the deployment's answers: campaigns, one campaign, keys (async reads
through a ``Backend``) and the planner (the accountant in this process, off the event loop)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from deniable.admin.campaigns import campaign_dict
from deniable.admin.keys import key_row
from deniable.console import svg
from deniable.console.backend import Backend
from deniable.console.pages import Page, action_button, any_open, campaign_url, definition_list, when
from deniable.console.tables import Column, Table, fixed, plain
from deniable.sim.render import manipulation_line, privacy_line
from deniable.v1 import deniable_pb2 as pb

CAMPAIGN_COLUMNS = (
    Column("id", "campaign"),
    Column("state", "state"),
    Column("kind", "kind"),
    Column("mechanism", "mechanism"),
    Column("window_end", "window ends (UTC)", lambda v: when(v) if v else "no end"),
    Column("counted", "devices counted"),
    Column("held", "held at the shuffler (reports)", lambda v: "unknown" if v is None else str(v)),
    Column("batch_target", "batch target (devices)"),
    Column("n_min", "n_min (devices)"),
    Column("batches", "batches"),
    Column("last_batch", "last batch (UTC)", when),
    Column(
        "rejected", "rejections by reason", lambda v: ", ".join(f"{k}: {n}" for k, n in v.items()) or "none"
    ),
)


def _campaign_rows(status: dict[str, Any], kinds: dict[str, str]) -> list[dict[str, Any]]:
    """One row per campaign from ``gather_status`` (held: None without a shuffler operator address)."""
    rows = []
    for c in status["campaigns"]:
        held = c["held_at_shufflers"]
        known = bool(status["shufflers"]) and not any("error" in s for s in status["shufflers"])
        rows.append(
            {
                "id": c["id"],
                "state": "closed" if c["closed"] else "collecting",
                "kind": kinds.get(c["id"], ""),
                "mechanism": c["mechanism"],
                "window_end": c["window_end_unix"],
                "counted": c["counted"],
                "held": (held["pending"] + held["in_flight"]) if held else (0 if known else None),
                "batch_target": c["batch_target"],
                "n_min": c["n_min"],
                "batches": c["batches"],
                "last_batch": c["last_batch_unix"],
                "rejected": c["rejected"],
            }
        )
    return rows


async def campaigns_page(backend: Backend, csrf: str, allow_actions: bool) -> Page:
    """Every campaign's state and progress; with actions allowed, the create form."""
    status = await backend.status()
    kinds = {c.id: pb.DomainKind.Name(c.kind).lower() for c in await backend.campaigns()}
    rows = _campaign_rows(status, kinds)
    table = Table("campaigns", "Campaigns", CAMPAIGN_COLUMNS, rows, link=lambda r: campaign_url(r["id"]))
    unreachable = [s for s in status["shufflers"] if "error" in s]
    note = "".join(
        f'<p class="warn">shuffler {escape(s["address"])}: {escape(s["error"])}</p>' for s in unreachable
    )
    if not status["shufflers"]:
        note += (
            '<p class="muted">Held at the shuffler: unknown (start the console with --shuffler-operator).</p>'
        )
    body = note + table.html("/") + (create_form(csrf) if allow_actions else "")
    return Page("Campaigns", body, (table,), refresh=any_open(status["campaigns"]))


def create_form(csrf: str) -> str:
    """The create-campaign form (labelled fields; the action asks for confirmation)."""
    from deniable.console.pages import csrf_field

    fields = (
        ("c-id", "id", "Campaign id", "text", 'required pattern="[A-Za-z0-9._-]{1,64}"'),
        ("c-question", "question", "Question", "text", "required"),
        ("c-labels", "labels", "Labels (comma-separated; categorical)", "text", ""),
        ("c-eps", "epsilon0", "ε0 (local epsilon)", "number", 'step="any" min="0.01" value="1" required'),
        ("c-nmin", "n_min", "n_min (devices)", "number", 'min="0" value="0"'),
    )
    inputs = "".join(
        f'<p><label for="{i}">{label}</label> <input id="{i}" name="{name}" type="{kind}" {extra}></p>'
        for i, name, label, kind, extra in fields
    )
    kind = (
        '<p><label for="c-kind">Kind</label> <select id="c-kind" name="kind">'
        '<option value="binary">binary</option><option value="categorical">categorical</option></select></p>'
    )
    return (
        '<h2>Create a campaign</h2><form method="post" action="/actions/create">'
        f'{csrf_field(csrf)}{inputs}{kind}<button type="submit">Create…</button></form>'
    )


def _bucket_rows(answer: pb.QueryResponse, simultaneous: pb.QueryResponse) -> list[dict[str, Any]]:
    """Per bucket: raw count, estimate, std error, the 95 % and the simultaneous interval."""
    return [
        {
            "bucket": b.label,
            "raw_count": b.raw_count,
            "estimate": b.estimate,
            "std_error": b.std_error,
            "ci_low": b.ci_low,
            "ci_high": b.ci_high,
            "sim_ci_low": s.ci_low,
            "sim_ci_high": s.ci_high,
        }
        for b, s in zip(answer.buckets, simultaneous.buckets, strict=True)
    ]


BUCKET_COLUMNS = (
    Column("bucket", "bucket"),
    Column("raw_count", "randomised reports"),
    Column("estimate", "estimate (devices)", fixed(1)),
    Column("std_error", "std error (devices)", fixed(1)),
    Column("ci_low", "95% CI low", fixed(1)),
    Column("ci_high", "95% CI high", fixed(1)),
    Column("sim_ci_low", "simultaneous 95% CI low", fixed(1)),
    Column("sim_ci_high", "simultaneous 95% CI high", fixed(1)),
)


def privacy_items(answer: pb.QueryResponse) -> list[tuple[str, str]]:
    """The privacy statement in words, one term per line."""
    p = answer.privacy
    local = (
        f"ε0 = {p.epsilon0:g} per report: each device keeps it whatever the shuffler or others do"
        if p.local_guarantee
        else "none: a shuffle-model protocol; a report alone is not private, only the shuffled batch is"
    )
    central = (
        f"(ε, δ) = ({p.central_epsilon:.4g}, {p.delta:.3g})"
        if math.isfinite(p.central_epsilon)
        else f"none can be stated: {p.epsilon_unavailable or p.note or 'no analysis applies'}"
    )
    return [
        ("Local guarantee", local),
        ("Central guarantee at the batches formed", central),
        ("Analysis", p.analysis or "–"),
        (
            "Smallest batch (devices)",
            f"{p.smallest_batch} of {p.batches} batches; target {p.batch_target or '–'}",
        ),
        ("Below n_min authorised", "yes" if p.below_n_min_authorised else "no"),
        ("In one sentence", privacy_line(p)),
        ("Manipulation budget", manipulation_line(answer)),
    ]


async def campaign_page(backend: Backend, campaign_id: str, csrf: str, allow_actions: bool) -> Page:
    """One campaign: chart and table of the estimates, the guarantee in words, budget, key state."""
    campaign = await backend.campaign(campaign_id)
    binary = campaign.kind == pb.BINARY
    answer = await backend.estimate(campaign_id, binary, simultaneous=False)
    together = await backend.estimate(campaign_id, binary, simultaneous=True)
    rows = _bucket_rows(answer, together)
    table = Table("estimates", f"Estimates of {answer.n} devices (95% intervals)", BUCKET_COLUMNS, rows)
    chart = svg.interval_chart(
        [
            svg.Interval(
                r["bucket"], r["estimate"], r["ci_low"], r["ci_high"], r["sim_ci_low"], r["sim_ci_high"]
            )
            for r in rows
        ],
        f"Estimated count per bucket of {campaign_id}",
        "estimated count (devices)",
    )
    legend = (
        '<p class="legend-text">Dot: estimate · thick bar: 95% CI · thin bar: simultaneous 95% CI'
        " (Bonferroni over the buckets).</p>"
    )
    info = campaign_dict(campaign)
    key_state = next((k.state for k in (await backend.keys()).keys if k.key_id == campaign.key_id), "unknown")
    facts = definition_list(
        [
            ("Question", info["question"]),
            ("State", "closed" if campaign.closed else "collecting"),
            ("Kind and mechanism", f"{info['kind']}, {info['mechanism']}"),
            (
                "Window",
                f"{when(campaign.window_start_unix)} to "
                + (when(campaign.window_end_unix) if campaign.window_end_unix else "no end"),
            ),
            ("Key", f"{campaign.key_id} ({key_state}), {campaign.hpke_suite}"),
        ]
    )
    actions = _campaign_actions(campaign, csrf) if allow_actions else ""
    body = (
        f"{facts}<h2>Estimates</h2><figure>{chart}<figcaption>{legend}</figcaption></figure>"
        f"{table.html(campaign_url(campaign_id))}<h2>Privacy</h2>{definition_list(privacy_items(answer))}{actions}"
    )
    return Page(f"Campaign {campaign_id}", body, (table,), refresh=not campaign.closed)


def _campaign_actions(campaign: pb.Campaign, csrf: str) -> str:
    """Close and release-below-n_min buttons (each asks for confirmation)."""
    hidden = {"campaign": campaign.id}
    buttons = "" if campaign.closed else action_button("close", "Close the window now…", csrf, hidden)
    buttons += action_button("release", "Release batches below n_min…", csrf, hidden)
    return f"<h2>Actions</h2><p>{buttons}</p>"


KEY_COLUMNS = (
    Column("key_id", "key id"),
    Column("state", "state"),
    Column("kem", "KEM"),
    Column("suite", "HPKE suite"),
    Column("active", "active", lambda v: "yes" if v else "no"),
    Column("campaigns", "campaigns sealed to it", lambda v: ", ".join(v) or "none"),
)


async def keys_page(backend: Backend, csrf: str, allow_actions: bool) -> Page:
    """The keyring (public keys are public; nothing private is ever listed) and, if allowed, rotate."""
    listing = await backend.keys()
    rows = [{k: v for k, v in key_row(key).items() if k != "public_key"} for key in listing.keys]
    table = Table("keys", "HPKE keys", KEY_COLUMNS, rows)
    signing = f"<p>Campaign-signing public key: <code>{listing.signing_public_key.hex()}</code></p>"
    rotate = ""
    if allow_actions:
        rotate = (
            "<h2>Actions</h2><p>"
            + action_button("rotate", "Rotate the HPKE key…", csrf, {"kem": "x25519"})
            + "</p>"
        )
    return Page("Keys", signing + table.html("/keys") + rotate, (table,))


def planner_rows(candidates: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per planner candidate."""
    return [
        {
            "mechanism": c.mechanism,
            "feasible": c.feasible,
            "epsilon0": c.epsilon0,
            "central_epsilon": c.central_epsilon,
            "std_error": c.expected_std_error,
            "messages_per_device": c.messages_per_device,
            "bytes_per_device": c.bytes_per_device,
            "local_guarantee": (f"ε0 = {c.epsilon0:.4g}" if c.local_privacy else "none")
            if c.feasible
            else "–",
            "note": c.note,
        }
        for c in candidates
    ]


PLAN_COLUMNS = (
    Column("mechanism", "mechanism"),
    Column("feasible", "meets the target", lambda v: "yes" if v else "no"),
    Column("epsilon0", "ε0", fixed(3)),
    Column("central_epsilon", "central ε", fixed(3)),
    Column("std_error", "expected std error (devices)", fixed(2)),
    Column("messages_per_device", "messages per device", fixed(2)),
    Column("bytes_per_device", "bytes per device", fixed(0)),
    Column("local_guarantee", "local guarantee"),
    Column("note", "note", plain),
)
