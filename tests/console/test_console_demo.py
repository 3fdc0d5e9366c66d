"""``deniable demo --console``: the console serves the demo's counted campaigns while the services
still run, and Ctrl-C (the task cancelled) ends it so the demo can print its tables."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from deniable.cli.main import build_parser
from deniable.console.server import ConsoleConfig, demo_console, start_console
from deniable.sim.demo import run_pipeline
from deniable.sim.local import LocalServices


async def test_demo_holds_its_services_for_the_console(tmp_path: Path) -> None:
    seen: list[str] = []

    async def hold(services: LocalServices) -> None:
        assert services.shuffler.operator_address is not None  # the console sees held reports
        certs = services.certs
        config = ConsoleConfig(
            services.aggregator.address,
            certs.client_tls("aggregator", "aggregator-operator"),
            services.shuffler.operator_address,
            certs.client_tls("shuffler", "shuffler-operator"),
            listen="127.0.0.1:0",
        )
        runner, url = await start_console(config)
        try:
            async with aiohttp.ClientSession() as http, http.get(url + "?format=json") as response:
                seen.extend(row["id"] for row in await response.json())
        finally:
            await runner.cleanup()

    campaigns = await run_pipeline(300, 2.0, tmp_path, progress=False, hold=hold)
    assert sorted(seen) == sorted(c.request.id for c in campaigns)


async def test_cancelling_the_demo_console_returns(tmp_path: Path) -> None:
    from deniable.core.plumbing.certs import write_dev_certs

    certs = write_dev_certs(tmp_path)
    operator = certs.client_tls("aggregator", "aggregator-operator")
    task = asyncio.create_task(demo_console("127.0.0.1:1", operator, None, None, "127.0.0.1:0"))
    await asyncio.sleep(0.2)
    task.cancel()
    await task  # returns normally: the demo goes on to print and stop its services


def test_demo_console_option() -> None:
    args = build_parser().parse_args(["demo", "--console"])
    assert args.console == "127.0.0.1:8080"
    assert build_parser().parse_args(["demo"]).console is None
