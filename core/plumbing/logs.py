"""Structured (JSON lines) logging for the services. Never log a client identifier."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
FORMATS: Final = ("json", "text")
LEVELS: Final = ("debug", "info", "warning", "error", "critical")


def timestamp(created: float) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-11-26T01:02:03.456Z``."""
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ms), level, logger, message and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")})
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger: message`` with millisecond UTC timestamps, for people at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{timestamp(record.created)} {record.levelname} {record.name}: {record.getMessage()}"
        return line + ("\n" + self.formatException(record.exc_info) if record.exc_info else "")


def configure_logging(level: str = "info", json_lines: bool = True) -> None:
    """Send every logger (the root, so grpc, asyncio and libraries too) to stderr, as JSON lines
    unless ``json_lines`` is False; ``deniable`` loggers at ``level``, others at WARNING or above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(logging.WARNING, logging.getLevelName(level.upper())))
    ours = logging.getLogger("deniable")
    ours.handlers[:] = []
    ours.setLevel(level.upper())
    ours.propagate = True
