"""The four actions (create, close, release below n_min, rotate key): each shows what it will do
and runs only when the confirmation form (confirm=yes, same CSRF token) comes back."""

from __future__ import annotations

import logging

from deniable.admin.campaigns import CampaignSpec
from deniable.console.backend import Backend
from deniable.console.pages import Page, campaign_url, confirm_page, message_page

log = logging.getLogger("deniable.console")


def _summary(name: str, form: dict[str, str]) -> tuple[str, str]:
    """(what the action will do in words, where to go back to); KeyError for an unknown action."""
    campaign = form.get("campaign", "")
    texts = {
        "create": (
            f"Create campaign {form.get('id', '')!r} ({form.get('kind', '')},"
            f" ε0 = {form.get('epsilon0', '')},"
            f" n_min = {form.get('n_min', '0') or '0'}): devices may start reporting to it.",
            "/",
        ),
        "close": (
            f"Close the window of {campaign!r} now: no further reports are accepted.",
            campaign_url(campaign),
        ),
        "release": (
            f"Authorise batches of {campaign!r} below n_min: they protect fewer devices, and every answer"
            " will say so.",
            campaign_url(campaign),
        ),
        "rotate": ("Rotate the HPKE key: new campaigns are sealed to a new key.", "/keys"),
    }
    return texts[name]


async def handle(backend: Backend, name: str, form: dict[str, str], csrf: str) -> Page:
    """Confirmation page, or (confirm=yes) the action's result in one line."""
    try:
        summary, back = _summary(name, form)
    except KeyError:
        return message_page("Unknown action", f"no action {name!r}", "/", 404)
    if form.get("confirm") != "yes":
        return confirm_page(name, summary, form, csrf, back)
    try:
        done = await _run(backend, name, form)
    except ValueError as exc:
        return message_page("Refused", str(exc), back, 400)
    log.info("action %s done", name)
    return message_page("Done", done, back if name != "create" else campaign_url(form.get("id", "")))


async def _run(backend: Backend, name: str, form: dict[str, str]) -> str:
    """Run one confirmed action; the result in words."""
    if name == "create":
        labels = [s for s in form.get("labels", "").split(",") if s.strip()]
        spec = CampaignSpec(
            id=form.get("id", ""),
            question=form.get("question", ""),
            kind="categorical" if form.get("kind") == "categorical" else "binary",
            labels=labels,
            epsilon0=float(form.get("epsilon0", "1") or "1"),
            n_min=int(form.get("n_min", "0") or "0"),
        )
        created = await backend.create(spec)
        return f"campaign {created.id} created, sealed to key {created.key_id}"
    if name == "close":
        closed = await backend.close(form.get("campaign", ""))
        return f"campaign {closed.id} closed"
    if name == "release":
        await backend.release(form.get("campaign", ""))
        return f"batches of {form.get('campaign', '')} below n_min authorised"
    key = await backend.rotate(form.get("kem", "x25519"))
    return f"key {key.key_id} ({key.kem}) is now active"
