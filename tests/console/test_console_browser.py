"""The console in a real browser against real services (ADR 0037).

An aggregator and a shuffler (with its operator port) run on loopback with TLS; simulated devices
report through the client SDK; the console serves them; headless Chromium (Debian's
/usr/bin/chromium driven by playwright; nothing downloads a browser) visits every page. Checked:
the numbers shown equal the query API's answers at the printed precision, no console errors,
every form field is labelled and the planner works from the keyboard, a close runs only after
its confirmation, a POST without the CSRF token is refused. Screenshots go to the test's tmp dir
(and to $DENIABLE_CONSOLE_SCREENSHOTS when set: docs/console/ was made that way); page weights
and the time to first contentful paint are printed.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deniable.admin.campaigns import CampaignSpec
from deniable.admin.queries import query
from deniable.console.server import ConsoleConfig, start_console
from deniable.core.plumbing.tls import Transport
from deniable.sim.local import LocalServices, local_services
from deniable.v1 import deniable_pb2 as pb

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
playwright_api = pytest.importorskip("playwright.async_api", reason="the [dev] extra installs playwright")


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[tuple[LocalServices, Transport]]:
    """Real services with two campaigns: ``colours`` counted and closed, ``lights`` still collecting."""
    async with local_services(tmp_path / "svc", operator_listen="127.0.0.1:0") as services:
        operator = services.certs.client_tls("aggregator", "aggregator-operator")
        colours = CampaignSpec(
            id="colours",
            question="Favourite colour?",
            kind="categorical",
            labels=["red", "green", "blue"],
            mechanism="grr",
            epsilon0=2.0,
            n_min=50,
        )
        lights = CampaignSpec(id="lights", question="Lights on?", kind="binary", epsilon0=1.0, n_min=10_000)
        await services.create_campaign(colours.request(0))
        await services.create_campaign(lights.request(0))
        await services.report("colours", [0] * 120 + [1] * 60 + [2] * 20)
        await services.report("lights", [1, 0] * 15)
        await services.close_and_count("colours")
        yield services, operator


async def _visit(page: Any, url: str, weights: dict[str, Any], name: str) -> None:
    """Go to ``url``; record bytes of every response (document, CSS, JS) and the first paint."""
    sizes: list[int] = []

    async def record(response: Any) -> None:
        sizes.append(len(await response.body()))

    page.on("response", record)
    await page.goto(url)
    await page.wait_for_load_state("networkidle")
    page.remove_listener("response", record)
    paint = await page.evaluate(
        "() => (performance.getEntriesByName('first-contentful-paint')[0] || {startTime: -1}).startTime"
    )
    weights[name] = {
        "bytes": sum(sizes),
        "requests": len(sizes),
        "first_contentful_paint_ms": round(paint, 1),
    }


async def _labelled(page: Any) -> None:
    """Every visible input and select has a <label for> or sits inside a <label>."""
    missing = await page.evaluate(
        """() => [...document.querySelectorAll('input:not([type=hidden]), select')]
             .filter(e => !(e.id && document.querySelector(`label[for="${e.id}"]`)) && !e.closest('label'))
             .map(e => e.name)"""
    )
    assert missing == []


async def _numbers_match(page: Any, answer: pb.QueryResponse, together: pb.QueryResponse) -> None:
    """The estimates table shows the query API's numbers at one decimal."""
    rows = page.locator("#t-estimates tbody tr")
    assert await rows.count() == len(answer.buckets)
    for index, (bucket, sim) in enumerate(zip(answer.buckets, together.buckets, strict=True)):
        row = rows.nth(index)
        shown = {
            key: await row.locator(f'[data-key="{key}"]').inner_text()
            for key in (
                "bucket",
                "raw_count",
                "estimate",
                "std_error",
                "ci_low",
                "ci_high",
                "sim_ci_low",
                "sim_ci_high",
            )
        }
        assert shown == {
            "bucket": bucket.label,
            "raw_count": str(bucket.raw_count),
            "estimate": f"{bucket.estimate:.1f}",
            "std_error": f"{bucket.std_error:.1f}",
            "ci_low": f"{bucket.ci_low:.1f}",
            "ci_high": f"{bucket.ci_high:.1f}",
            "sim_ci_low": f"{sim.ci_low:.1f}",
            "sim_ci_high": f"{sim.ci_high:.1f}",
        }


async def test_every_page_in_chromium(deployment: tuple[LocalServices, Transport], tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: scripts/system-deps.sh installs it", pytrace=False)
    services, operator = deployment
    config = ConsoleConfig(
        services.aggregator.address,
        operator,
        services.shuffler.operator_address,
        services.certs.client_tls("shuffler", "shuffler-operator"),
        listen="127.0.0.1:0",
        allow_actions=True,
    )
    runner, url = await start_console(config)
    agg = services.aggregator.address
    request = pb.QueryRequest(campaign_id="colours", confidence=0.95)
    answer = await query(agg, request, operator)
    together = await query(
        agg, pb.QueryRequest(campaign_id="colours", confidence=0.95, simultaneous=True), operator
    )
    weights: dict[str, Any] = {}
    errors: list[str] = []
    shots = tmp_path / "screenshots"
    try:
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
            page = await browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            await _pages(page, url, answer, together, weights, shots)
            await _actions_and_csrf(page, url)
            await browser.close()
    finally:
        await runner.cleanup()
    assert errors == []
    for name, weight in weights.items():
        print(
            f"console page {name}: {weight['bytes']} bytes in {weight['requests']} requests,"
            f" first contentful paint {weight['first_contentful_paint_ms']} ms"
        )
    _keep_screenshots(shots)


async def _pages(
    page: Any,
    url: str,
    answer: pb.QueryResponse,
    together: pb.QueryResponse,
    weights: dict[str, Any],
    shots: Path,
) -> None:
    """Campaigns, one campaign, keys, planner: content, labels, numbers, screenshots."""
    await _visit(page, url, weights, "campaigns")
    table = page.locator("#t-campaigns")
    assert await table.locator("tbody tr").count() == 2
    lights = table.locator("tbody tr", has_text="lights")
    assert await lights.locator('[data-key="state"]').inner_text() == "collecting"
    assert await lights.locator('[data-key="held"]').inner_text() == "30"
    await _labelled(page)
    await page.screenshot(path=str(shots / "campaigns.png"), full_page=True)

    await page.click("text=colours")
    await page.wait_for_load_state("networkidle")
    await _visit(page, url + "campaigns/colours", weights, "campaign")
    await _numbers_match(page, answer, together)
    assert await page.locator("svg.chart circle.est").count() == len(answer.buckets)
    statement = await page.locator("dl").nth(1).inner_text()
    assert f"ε0 = {answer.privacy.epsilon0:g} per report" in statement
    assert f"{answer.privacy.smallest_batch} of {answer.privacy.batches} batches" in statement
    await page.screenshot(path=str(shots / "campaign.png"), full_page=True)
    await page.emulate_media(color_scheme="dark")  # the dark theme: same page, its own colours
    background = await page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(15, 20, 25)"
    await page.screenshot(path=str(shots / "campaign-dark.png"), full_page=True)
    await page.emulate_media(color_scheme="light")

    await _visit(page, url + "keys", weights, "keys")
    assert "active" in await page.locator("#t-keys").inner_text()
    await page.screenshot(path=str(shots / "keys.png"), full_page=True)

    await _visit(page, url + "planner", weights, "planner-form")
    await _labelled(page)
    await page.focus("#p-eps")
    await page.keyboard.press("Control+A")
    await page.keyboard.type("1.5")
    for _ in range(4):
        await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")  # submits the form from the keyboard
    await page.wait_for_selector("#t-candidates", timeout=120_000)
    assert "/planner?" in page.url and "target_epsilon=1.5" in page.url
    await _visit(page, page.url, weights, "planner-result")
    assert await page.locator("svg.chart polyline").count() >= 1
    await page.screenshot(path=str(shots / "planner.png"), full_page=True)


async def _actions_and_csrf(page: Any, url: str) -> None:
    """A POST without the token is refused; close asks for confirmation, then closes."""
    refused = await page.request.post(url + "actions/close", form={"campaign": "lights", "confirm": "yes"})
    assert refused.status == 403
    await page.goto(url + "campaigns/lights")
    await page.click("text=Close the window now…")
    assert "Confirm" in await page.locator("h1").inner_text()
    await page.click("text=Yes, close")
    assert "campaign lights closed" in await page.locator("main").inner_text()


def _keep_screenshots(shots: Path) -> None:
    """Copy the screenshots where $DENIABLE_CONSOLE_SCREENSHOTS says (regenerating docs/console/)."""
    assert sorted(p.name for p in shots.glob("*.png")) == [
        "campaign-dark.png",
        "campaign.png",
        "campaigns.png",
        "keys.png",
        "planner.png",
    ]
    target = os.environ.get("DENIABLE_CONSOLE_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        from PIL import Image  # comes with matplotlib ([plot] extra, in [dev])

        for shot in shots.glob("*.png"):  # a 64-colour palette keeps docs/console/ small
            Image.open(shot).convert("RGB").quantize(colors=64).save(Path(target) / shot.name, optimize=True)
