"""PostgreSQL DSNs as every service shows and checks them: password and query string never printed."""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit

DSN_SCHEMES: Final = ("postgresql", "postgres")


def describe_dsn(dsn: str) -> str:
    """The DSN without password or query string, safe to log and to show in errors."""
    try:
        parts = urlsplit(dsn)
        netloc = parts.netloc.rpartition("@")
        user = netloc[0].partition(":")[0]
        where = f"{user}@{netloc[2]}" if user else netloc[2]
        return f"{parts.scheme}://{where}{parts.path}"
    except ValueError:
        return "(unparseable DSN)"


def is_postgres_dsn(spec: str) -> bool:
    """Whether ``spec`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return spec.split("://", 1)[0].lower() in DSN_SCHEMES and "://" in spec


def one_line(exc: BaseException) -> str:
    """An exception as one line (PostgreSQL messages may carry a detail on further lines)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
