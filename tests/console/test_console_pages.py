"""The console's pages and handlers against a fake backend (aiohttp's test client, no services):
every page renders and escapes, tables export as CSV and JSON, security headers, CSRF, login,
read-only by default, confirmation before an action, the listen rule and the token hash."""

from __future__ import annotations

import io
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from support.console_fake import FakeBackend

from deniable.console.app import STATE, Console, build_app
from deniable.console.auth import check_listen, hash_token, verify_token
from deniable.console.server import ConsoleConfig, console_for
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.tls import INSECURE


@pytest.fixture
async def make_client() -> AsyncIterator[Callable[..., object]]:
    clients: list[Any] = []

    async def make(**options: Any) -> Any:
        backend = options.pop("backend", FakeBackend())
        client = TestClient(TestServer(build_app(Console(backend, **options))))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert match, "no CSRF token in the page"
    return match.group(1)


async def test_every_page_renders_with_headers_and_escaping(make_client) -> None:
    client = await make_client()
    for path in ("/", "/campaigns/colours", "/keys", "/planner"):
        response = await client.get(path)
        text = await response.text()
        assert response.status == 200, (path, text)
        assert response.headers["Content-Security-Policy"].startswith("default-src 'self'; script-src 'self'")
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Referrer-Policy"] == "no-referrer"
        assert "<script>" not in text and " style=" not in text and "<colour>" not in text
    page = await (await client.get("/campaigns/colours")).text()
    assert "Favourite &lt;colour&gt;?" in page and "<svg" in page and "398.2" in page
    assert "simultaneous 95% CI" in page and "ε0 = 2 per report" in page
    assert "(ε, δ) = (0.31, 1e-06)" in page and "feldman-mcmillan-talwar" in page
    assert "Manipulation budget" in page and "key" in page.lower() and 'data-refresh="5"' in page
    campaigns = await (await client.get("/")).text()
    assert ">7<" in campaigns and "bad_padding: 2" in campaigns and "categorical" in campaigns


async def test_tables_export_as_csv_and_json(make_client) -> None:
    client = await make_client()
    rows = json.loads(await (await client.get("/campaigns/colours?format=json")).text())
    assert [r["bucket"] for r in rows] == ["red", "green", "blue"] and rows[0]["estimate"] == 398.25
    response = await client.get("/campaigns/colours?format=csv&table=estimates")
    assert response.content_type == "text/csv"
    lines = (await response.text()).splitlines()
    assert lines[0].startswith("bucket,raw_count,estimate") and lines[1].startswith("red,410,398.25")
    listed = json.loads(await (await client.get("/?format=json")).text())
    assert listed[0]["held"] == 7 and listed[0]["rejected"] == {"bad_padding": 2}
    keys = await (await client.get("/keys?format=csv")).text()
    assert keys.startswith("key_id,state")


async def test_read_only_by_default(make_client) -> None:
    backend = FakeBackend()
    client = await make_client(backend=backend)
    page = await (await client.get("/campaigns/colours")).text()
    assert "/actions/" not in page
    token_page = await (await client.get("/planner")).text()
    assert "Plan" in token_page
    # even with a valid session token, a read-only console refuses actions
    response = await client.post(
        "/actions/close", data={"csrf": _csrf_from_session(client), "campaign": "colours", "confirm": "yes"}
    )
    assert response.status == 403 and backend.calls == []


async def test_actions_need_the_csrf_token_and_a_confirmation(make_client) -> None:
    backend = FakeBackend()
    client = await make_client(backend=backend, allow_actions=True)
    page = await (await client.get("/campaigns/colours")).text()
    token = _csrf(page)
    refused = await client.post("/actions/close", data={"campaign": "colours", "confirm": "yes"})
    assert refused.status == 403 and "CSRF" in await refused.text()
    forged = await client.post(
        "/actions/close", data={"csrf": "0" * 64, "campaign": "colours", "confirm": "yes"}
    )
    assert forged.status == 403 and backend.calls == []
    asked = await client.post("/actions/close", data={"csrf": token, "campaign": "colours"})
    assert asked.status == 200 and "Confirm" in await asked.text() and backend.calls == []
    done = await client.post("/actions/close", data={"csrf": token, "campaign": "colours", "confirm": "yes"})
    assert done.status == 200 and backend.calls == [("close", "colours")]
    for name, fields in (
        ("release", {"campaign": "colours"}),
        ("rotate", {"kem": "x25519"}),
        ("create", {"id": "new", "question": "Q?", "kind": "binary", "epsilon0": "1"}),
    ):
        await client.post(f"/actions/{name}", data={"csrf": token, "confirm": "yes", **fields})
    assert [c[0] for c in backend.calls] == ["close", "release", "rotate", "create"]


async def test_a_token_from_another_session_is_refused(make_client) -> None:
    backend = FakeBackend()
    client = await make_client(backend=backend, allow_actions=True)
    other = await make_client(backend=backend, allow_actions=True)
    token = _csrf(await (await other.get("/")).text())
    await client.get("/")
    response = await client.post("/actions/rotate", data={"csrf": token, "kem": "x25519", "confirm": "yes"})
    assert response.status == 403 and backend.calls == []


async def test_login_with_the_hashed_token(make_client) -> None:
    client = await make_client(login_hash=hash_token("correct horse battery"))
    first = await (await client.get("/")).text()
    assert "Operator token" in first and "colours" not in first
    csrf = _csrf(first)
    before = _csrf_from_session(client)
    assert (await client.post("/login", data={"token": "correct horse battery"})).status == 403  # no CSRF
    wrong = await client.post("/login", data={"csrf": csrf, "token": "wrong token here"})
    assert wrong.status == 401
    await client.post("/login", data={"csrf": csrf, "token": "correct horse battery"})
    assert "colours" in await (await client.get("/")).text()
    assert _csrf_from_session(client) != before  # the session id changed at login


def test_cli_refuses_a_non_loopback_start_and_hashes_tokens(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deniable.cli.main import main

    assert main(["console", "--insecure", "--listen", "0.0.0.0:8080"]) == 2
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("a token long enough\n"))
    assert main(["console", "hash-token"]) == 0
    assert verify_token("a token long enough", capsys.readouterr().out.strip())


def _csrf_from_session(client: Any) -> str:
    console = client.server.app[STATE]
    cookie = client.session.cookie_jar.filter_cookies(client.make_url("/"))["deniable_console"].value
    assert console.sessions is not None
    return str(console.sessions.csrf(cookie))


def test_token_hash_is_scrypt_and_verifies() -> None:
    stored = hash_token("s3cret-token-xyz", salt=b"\x00" * 16)
    assert stored.startswith("scrypt$32768$8$1$") and "s3cret" not in stored
    assert verify_token("s3cret-token-xyz", stored) and not verify_token("s3cret-token-xyy", stored)
    assert not verify_token("x", "md5$abc")


def test_non_loopback_without_tls_and_login_is_refused(tmp_path: Path) -> None:
    check_listen("127.0.0.1", False, False)
    check_listen("::1", False, False)
    with pytest.raises(ConfigurationError, match=r"refusing to listen on 0\.0\.0\.0.*TLS.*login"):
        check_listen("0.0.0.0", False, False)
    with pytest.raises(ConfigurationError, match="without a login"):
        check_listen("192.0.2.1", True, False)
    check_listen("192.0.2.1", True, True)
    with pytest.raises(ConfigurationError, match=r"refusing to listen on 10\.1\.2\.3"):
        console_for(ConsoleConfig("127.0.0.1:7700", INSECURE, listen="10.1.2.3:8080"))
    hashed = tmp_path / "login"
    hashed.write_text(hash_token("a long enough token"))
    with pytest.raises(ConfigurationError, match="without TLS"):
        console_for(ConsoleConfig("127.0.0.1:7700", INSECURE, listen="0.0.0.0:8080", login_hash_file=hashed))


async def test_planner_plans_and_rejects_bad_input(make_client) -> None:
    client = await make_client()
    bad = await client.get("/planner?plan=1&target_epsilon=-1&delta=1e-6&n=1000&domain=4")
    assert bad.status == 400 and "target ε must lie" in await bad.text()
    ok = await client.get("/planner?plan=1&target_epsilon=1&delta=1e-6&n=10000&domain=4&mechanism=olh")
    text = await ok.text()
    assert ok.status == 200 and "olh" in text and "<polyline" in text and "bytes per device" in text


async def test_errors_are_one_line_and_logs_hold_no_request_data(make_client, caplog) -> None:
    client = await make_client(allow_actions=True)
    missing = await client.get("/campaigns/%3Cscript%3E")
    text = await missing.text()
    assert (
        missing.status == 502 and "LookupError: no campaign &lt;script&gt;" in text and "<script>" not in text
    )
    caplog.clear()
    await client.post("/actions/close", data={"campaign": "secret-campaign-x", "csrf": "bad"})
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "CSRF" in logged and "secret-campaign-x" not in logged and "bad" not in logged


def test_svg_escapes_labels_and_labels_axes() -> None:
    from deniable.console import svg

    chart = svg.interval_chart([svg.Interval("<b>", 5.0, 1.0, 9.0, 0.0, 10.0)], "t & u", "count (devices)")
    assert "&lt;b&gt;" in chart and "<b>" not in chart and "count (devices)" in chart and ">bucket<" in chart
    assert svg.ticks(0.0, 97.0) == [0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
    lines = svg.line_chart({"grr": [(0.5, 3.0), (1.0, float("inf"))]}, "e", "ε", "error (devices)")
    assert "<polyline" in lines and "inf" not in lines
