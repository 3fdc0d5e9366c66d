"""Logs: JSON lines for every logger (root configured, so grpc, asyncio and libraries too) with
millisecond timestamps, and no client identifier in any record a whole pipeline writes."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.logs import preserved_logger

from deniable.core.plumbing import logs
from deniable.sim.demo import run_pipeline

MS_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Put the root and ``deniable`` loggers back as they were (configure_logging is global)."""
    with preserved_logger(""), preserved_logger("deniable"):
        yield


def test_every_logger_writes_json_lines_with_milliseconds(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    logs.configure_logging("info")
    logging.getLogger("deniable.shuffler").info("ours", extra={"campaign": "c"})
    logging.getLogger("grpc._cython.cygrpc").warning("a library's")
    logging.getLogger("asyncio").error("the event loop's")
    logging.getLogger("some.library").info("below the libraries' WARNING floor: dropped")
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["msg"] for e in entries] == ["ours", "a library's", "the event loop's"]
    assert [e["logger"] for e in entries] == ["deniable.shuffler", "grpc._cython.cygrpc", "asyncio"]
    assert all(MS_TIMESTAMP.match(e["ts"]) for e in entries), entries
    assert entries[0]["campaign"] == "c"


def test_text_format_keeps_milliseconds(restore_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    logs.configure_logging("info", json_lines=False)
    logging.getLogger("deniable.aggregator").info("hello")
    stamp, level, rest = stream.getvalue().strip().split(" ", 2)
    assert MS_TIMESTAMP.match(stamp) and level == "INFO" and rest == "deniable.aggregator: hello"


class Capture(logging.Handler):
    """Every record, rendered the way production renders it (message and all extra fields)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logs.JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


async def test_a_pipeline_with_devices_logs_no_client_identifier(
    tmp_path: Path, restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 devices through TLS services at DEBUG: no record names a device's address or port, a
    report id, or a quota source. Control: the identifiers were seen (so the check can fail)."""
    peers: set[str] = set()
    report_ids: list[bytes] = []
    import deniable.client.reporter as reporter
    import deniable.shuffler.quota as quota
    from deniable.core.wire import new_report_id  # what the reporter imports and calls

    real_host, real_id = quota._host, new_report_id

    def host(peer: str) -> str:
        peers.add(peer)
        return real_host(peer)

    def report_id(*args: object) -> bytes:
        report_ids.append(real_id(*args))  # type: ignore[arg-type]
        return report_ids[-1]

    monkeypatch.setattr(quota, "_host", host)
    monkeypatch.setattr(reporter, "new_report_id", report_id)
    capture = Capture()
    root, ours = logging.getLogger(), logging.getLogger("deniable")
    root.addHandler(capture)
    ours.setLevel(logging.DEBUG)
    ours.propagate = True
    try:
        campaigns = await run_pipeline(devices=300, epsilon0=2.0, workdir=tmp_path, progress=False)
    finally:
        root.removeHandler(capture)
    assert all(c.acknowledged == 300 for c in campaigns)
    assert peers and len(report_ids) >= 300 and capture.lines  # the identifiers existed
    text = "\n".join(capture.lines)
    assert "listening on" in text
    forbidden = {p for p in peers} | {p.split(":", 1)[1] for p in peers}  # ipv4:h:port and h:port
    forbidden |= {r.hex() for r in report_ids} | {repr(r) for r in report_ids}
    leaked = sorted(f for f in forbidden if f in text)
    assert not leaked, f"client identifiers in the logs: {leaked[:5]}"
    assert not re.search(r"ipv[46]:", text)
