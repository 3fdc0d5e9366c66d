"""The pages as HTML (``html.escape`` on every value), each with the tables it exports.

No page ever holds a report id, a device address or a ciphertext: the console only reads the
aggregator's aggregates (status, estimates, descriptors, keys) through ``deniable.admin``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any
from urllib.parse import quote

from deniable.console.tables import Table

NAV = (("/", "Campaigns"), ("/planner", "Planner"), ("/keys", "Keys"))


@dataclass(frozen=True)
class Page:
    """A page's title, body and tables; ``refresh``: the script reloads <main> while it is true."""

    title: str
    body: str
    tables: Sequence[Table] = ()
    refresh: bool = False
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


def when(unix: float | int | None) -> str:
    """A Unix time as UTC text, or a dash."""
    return "–" if not unix else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(unix))


def campaign_url(campaign_id: str) -> str:
    """The campaign page's path."""
    return "/campaigns/" + quote(campaign_id, safe="")


def layout(page: Page, path: str, read_only: bool) -> str:
    """The whole document: header with navigation, <main>, the one static script and stylesheet."""
    current = ' aria-current="page"'
    links = "".join(f'<a href="{href}"{current if href == path else ""}>{name}</a>' for href, name in NAV)
    mode = "read-only" if read_only else "actions allowed"
    refresh = ' data-refresh="5"' if page.refresh else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(page.title)} · Deniable console</title>"
        '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
        '<link rel="stylesheet" href="/static/console.css">'
        '<script src="/static/console.js" defer></script></head>'
        f'<body><header><strong>Deniable</strong> operator console <nav aria-label="pages">{links}</nav>'
        f'<span class="mode">{mode}</span></header>'
        f'<main id="main"{refresh}><h1>{escape(page.title)}</h1>{page.body}</main></body></html>'
    )


def tables_html(tables: Sequence[Table], path: str) -> str:
    """Every table of a page with its export links."""
    return "".join(t.html(path) for t in tables)


def csrf_field(token: str) -> str:
    """The hidden synchronizer token every mutating form carries."""
    return f'<input type="hidden" name="csrf" value="{escape(token)}">'


def action_button(action: str, label: str, token: str, hidden: dict[str, str]) -> str:
    """A form that asks for confirmation first (POST to /actions/<action>)."""
    fields = "".join(
        f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in hidden.items()
    )
    return (
        f'<form method="post" action="/actions/{escape(action)}" class="inline">{csrf_field(token)}{fields}'
        f'<button type="submit">{escape(label)}</button></form>'
    )


def confirm_page(action: str, summary: str, fields: dict[str, str], token: str, back: str) -> Page:
    """'Are you sure?': the same form again with confirm=yes, and a way back."""
    hidden = "".join(
        f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">' for k, v in fields.items()
    )
    body = (
        f'<p class="warn">{escape(summary)}</p>'
        f'<form method="post" action="/actions/{escape(action)}">{csrf_field(token)}{hidden}'
        '<input type="hidden" name="confirm" value="yes">'
        f'<button type="submit">Yes, {escape(action.replace("-", " "))}</button> '
        f'<a href="{escape(back)}">Cancel</a></form>'
    )
    return Page("Confirm: " + action.replace("-", " "), body)


def message_page(title: str, text: str, back: str, status: int = 200) -> Page:
    """A one-paragraph answer (an action's result, or an error in one line)."""
    return Page(title, f'<p>{escape(text)}</p><p><a href="{escape(back)}">Back</a></p>', status=status)


def login_page(csrf: str, error: str = "") -> Page:
    """The token form (the console stores only its scrypt hash); it carries the CSRF token too."""
    err = f'<p class="warn" role="alert">{escape(error)}</p>' if error else ""
    body = (
        f'{err}<form method="post" action="/login">{csrf_field(csrf)}'
        '<label for="token">Operator token</label> '
        '<input id="token" name="token" type="password" autocomplete="current-password" required> '
        '<button type="submit">Log in</button></form>'
    )
    return Page("Log in", body, status=401 if error else 200)


def definition_list(items: Sequence[tuple[str, str]]) -> str:
    """<dl> of (term, text) pairs, both escaped."""
    return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in items) + "</dl>"


def error_text(exc: BaseException) -> str:
    """One line for a failed call (a gRPC status and its details when there is one)."""
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"{code().name}: {details()}"
    return f"{type(exc).__name__}: {exc}"


def any_open(campaigns: Sequence[dict[str, Any]]) -> bool:
    """Whether any campaign still collects (the page then refreshes)."""
    return any(not c.get("closed") for c in campaigns)
