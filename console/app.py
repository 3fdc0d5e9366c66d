"""The aiohttp application: routes, security headers, sessions, login, CSRF and the exports.

Reading needs no JavaScript; ``/static/console.js`` only re-fetches <main> while something collects.
Mutating requests (POST) need the session's CSRF token; actions exist only with ``allow_actions``
and each one shows a confirmation page before it runs.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from deniable.console import actions, views
from deniable.console.auth import Sessions, verify_token
from deniable.console.backend import Backend
from deniable.console.pages import Page, error_text, layout, login_page, message_page
from deniable.console.planner import form_html, parse_form, plan_page

log = logging.getLogger("deniable.console")
COOKIE = "deniable_console"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self';"
    " img-src 'self' data:;"
    " frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_SESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar("console_session", default=None)
"""The current request's session id (the middleware sets it; handlers run in its context)."""


@dataclass
class Console:
    """What every handler needs: the backend, the mode, the login hash and the sessions."""

    backend: Backend
    allow_actions: bool = False
    login_hash: str | None = None
    secure_cookie: bool = False
    sessions: Sessions | None = None

    def __post_init__(self) -> None:
        """Fresh sessions (and CSRF secret) per process."""
        self.sessions = self.sessions or Sessions()


STATE: web.AppKey[Console] = web.AppKey("console", Console)


def _session(request: web.Request) -> str | None:
    """The request's session id (set by the middleware)."""
    return _SESSION.get()


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Session cookie, login, CSRF on every POST, security headers on every answer."""
    console = request.app[STATE]
    assert console.sessions is not None
    session = request.cookies.get(COOKIE)
    fresh = session is None
    session = session or console.sessions.new_id()
    _SESSION.set(session)
    response = await _checked(request, handler, console, session)
    response.headers.update(SECURITY_HEADERS)
    if fresh:
        response.set_cookie(COOKIE, session, httponly=True, samesite="Strict", secure=console.secure_cookie)
    return response


async def _checked(
    request: web.Request, handler: Handler, console: Console, session: str
) -> web.StreamResponse:
    """Refuse a POST without the session's CSRF token (403) and anything before login (the form)."""
    assert console.sessions is not None
    if request.method == "POST":
        form = await request.post()
        token = form.get("csrf")
        if not console.sessions.csrf_ok(session, token if isinstance(token, str) else None):
            log.warning("refused a %s without a valid CSRF token", request.path)
            return _html(
                message_page("Refused", "missing or invalid CSRF token: reload the page", "/", 403),
                request,
                console,
            )
    public = request.path.startswith("/static/") or request.path == "/login"
    if console.login_hash and not public and session not in console.sessions.logged_in:
        return _html(login_page(console.sessions.csrf(session)), request, console)
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:  # one line, no traceback with request data in the page
        log.warning("%s failed: %s", request.path, error_text(exc))
        status = 404 if error_text(exc).startswith("NOT_FOUND") else 502
        return _html(message_page("Error", error_text(exc), "/", status), request, console)


def _html(page: Page, request: web.Request, console: Console) -> web.Response:
    """The page in the layout (or one of its tables as CSV/JSON with ?format=)."""
    fmt = request.query.get("format")
    if fmt in ("csv", "json") and page.tables:
        name = request.query.get("table", page.tables[0].name)
        table = next((t for t in page.tables if t.name == name), page.tables[0])
        if fmt == "json":
            return web.Response(text=table.export_json(), content_type="application/json")
        return web.Response(
            text=table.export_csv(),
            content_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="{table.name}.csv"'},
        )
    text = layout(page, request.path, not console.allow_actions)
    return web.Response(text=text, content_type="text/html", status=page.status, headers=page.headers)


async def campaigns(request: web.Request) -> web.StreamResponse:
    """GET /: every campaign."""
    console = request.app[STATE]
    page = await views.campaigns_page(console.backend, _csrf(request), console.allow_actions)
    return _html(page, request, console)


async def campaign(request: web.Request) -> web.StreamResponse:
    """GET /campaigns/{id}: one campaign."""
    console = request.app[STATE]
    page = await views.campaign_page(
        console.backend, request.match_info["id"], _csrf(request), console.allow_actions
    )
    return _html(page, request, console)


async def keys(request: web.Request) -> web.StreamResponse:
    """GET /keys: the keyring."""
    console = request.app[STATE]
    return _html(
        await views.keys_page(console.backend, _csrf(request), console.allow_actions), request, console
    )


async def planner(request: web.Request) -> web.StreamResponse:
    """GET /planner: the form, and with ?plan=1 the candidates and the chart."""
    console = request.app[STATE]
    if "plan" not in request.query:
        return _html(Page("Planner", form_html({})), request, console)
    try:
        values = parse_form(request.query, request.query.getall("mechanism", []))
        page = await plan_page(values)
    except ValueError as exc:
        page = Page("Planner", form_html(dict(request.query), str(exc)), status=400)
    return _html(page, request, console)


async def login(request: web.Request) -> web.StreamResponse:
    """GET /login: the form; POST: check the token against the scrypt hash."""
    console = request.app[STATE]
    assert console.sessions is not None
    if request.method == "GET" or not console.login_hash:
        return _html(login_page(_csrf(request)), request, console)
    token = (await request.post()).get("token")
    if isinstance(token, str) and verify_token(token, console.login_hash):
        fresh = console.sessions.new_id()  # a new session id at login: no session fixation
        console.sessions.logged_in.add(fresh)
        console.sessions.logged_in.discard(str(_session(request)))
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie(COOKIE, fresh, httponly=True, samesite="Strict", secure=console.secure_cookie)
        return response
    log.warning("a login failed")
    return _html(login_page(_csrf(request), "wrong token"), request, console)


def _csrf(request: web.Request) -> str:
    """The token forms of this session carry (empty before a session exists)."""
    console = request.app[STATE]
    assert console.sessions is not None
    session = _session(request)
    return console.sessions.csrf(session) if session else ""


async def static(request: web.Request) -> web.StreamResponse:
    """The stylesheet and the script, from the package."""
    name = request.match_info["name"]
    kinds = {"console.css": "text/css", "console.js": "text/javascript", "favicon.svg": "image/svg+xml"}
    if name not in kinds:
        raise web.HTTPNotFound()
    body = resources.files("deniable.console").joinpath("static", name).read_bytes()
    kind = kinds[name]
    return web.Response(body=body, content_type=kind, headers={"Cache-Control": "max-age=300"})


async def action(request: web.Request) -> web.StreamResponse:
    """POST /actions/{name}: confirmation first, then the action (only with allow_actions)."""
    console = request.app[STATE]
    if not console.allow_actions:
        return _html(
            message_page("Refused", "read-only console: start it with --allow-actions", "/", 403),
            request,
            console,
        )
    form = {k: v for k, v in (await request.post()).items() if isinstance(v, str) and k != "csrf"}
    page = await actions.handle(console.backend, request.match_info["name"], form, _csrf(request))
    return _html(page, request, console)


def build_app(console: Console) -> web.Application:
    """The application; ``console.backend`` answers every read and action."""
    app = web.Application(middlewares=[guard], client_max_size=64 * 1024)
    app[STATE] = console
    app.router.add_get("/", campaigns)
    app.router.add_get("/campaigns/{id}", campaign)
    app.router.add_get("/keys", keys)
    app.router.add_get("/planner", planner)
    app.router.add_route("*", "/login", login)
    app.router.add_get("/static/{name}", static)
    app.router.add_post("/actions/{name}", action)
    return app
