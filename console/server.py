"""Starting the console: ``ConsoleConfig`` checked (loopback, or TLS and a login), then served
until cancelled (``run_console``) or started for a test (``start_console``)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from deniable.console.app import Console, build_app
from deniable.console.auth import check_listen, read_hash_file
from deniable.console.backend import AdminBackend
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.tls import Transport

DEFAULT_LISTEN = "127.0.0.1:8080"


@dataclass(frozen=True)
class ConsoleConfig:
    """Where the console listens, whom it asks, and how it is protected."""

    aggregator: str
    operator_tls: Transport
    shuffler_operator: str | None = None
    shuffler_tls: Transport | None = None
    listen: str = DEFAULT_LISTEN
    allow_actions: bool = False
    https_cert: Path | None = None
    https_key: Path | None = None
    login_hash_file: Path | None = None

    def host_port(self) -> tuple[str, int]:
        """``listen`` split (ConfigurationError, one line, when malformed)."""
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(f"--listen takes HOST:PORT, got {self.listen!r}")
        return host.strip("[]"), int(port)


def _ssl_context(config: ConsoleConfig) -> ssl.SSLContext | None:
    """The console's own HTTPS context (TLS 1.2+), or None for plain HTTP."""
    if (config.https_cert is None) != (config.https_key is None):
        raise ConfigurationError("--https-cert and --https-key go together")
    if config.https_cert is None or config.https_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.https_cert, config.https_key)
    return context


def console_for(config: ConsoleConfig) -> tuple[web.Application, ssl.SSLContext | None]:
    """The checked application: refuses (ConfigurationError) a non-loopback listen without TLS and login."""
    host, _ = config.host_port()
    context = _ssl_context(config)
    login = read_hash_file(config.login_hash_file) if config.login_hash_file else None
    check_listen(host, context is not None, login is not None)
    backend = AdminBackend(
        config.aggregator, config.operator_tls, config.shuffler_operator, config.shuffler_tls
    )
    state = Console(backend, config.allow_actions, login, secure_cookie=context is not None)
    return build_app(state), context


async def start_console(config: ConsoleConfig) -> tuple[web.AppRunner, str]:
    """Serve in this event loop; (runner to clean up, the console's base URL with the real port)."""
    app, context = console_for(config)
    host, port = config.host_port()
    runner = web.AppRunner(app, access_log=None)  # no request lines in logs (ADR 0037)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    scheme = "https" if context else "http"
    shown = f"[{host}]" if ":" in host else host
    return runner, f"{scheme}://{shown}:{bound}/"


async def run_console(config: ConsoleConfig, announce: bool = True) -> None:
    """Serve until cancelled (Ctrl-C); prints the URL first."""
    runner, url = await start_console(config)
    if announce:
        mode = "actions allowed" if config.allow_actions else "read-only"
        print(f"console at {url} ({mode}); Ctrl-C to stop", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


async def demo_console(
    aggregator: str,
    operator: Transport,
    shuffler_operator: str | None,
    shuffler_tls: Transport | None,
    listen: str,
) -> None:
    """``deniable demo --console``: read-only over the demo's services, until Ctrl-C.

    Ctrl-C (the task cancelled) returns normally, so the demo goes on to print its tables and
    stops its services in order.
    """
    try:
        await run_console(ConsoleConfig(aggregator, operator, shuffler_operator, shuffler_tls, listen=listen))
    except asyncio.CancelledError:
        print("console stopped", flush=True)
