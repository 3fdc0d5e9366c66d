"""``deniable shuffler serve``'s HTTPS options become an ``HttpsConfig`` (docs/https.md)."""

from __future__ import annotations

import pytest

from deniable.cli.cmd_shuffler import _https
from deniable.cli.main import build_parser
from deniable.core.errors import ConfigurationError

BASE = ["shuffler", "serve", "--data-dir", "d", "--insecure"]


def _parsed(*extra: str):
    return build_parser().parse_args([*BASE, *extra])


def test_off_without_https_listen() -> None:
    assert _https(_parsed()) is None
    with pytest.raises(ConfigurationError, match="needs --https-listen"):
        _https(_parsed("--https-cors-origin", "https://app.example"))


def test_origins_repeated_or_comma_separated() -> None:
    config = _https(
        _parsed(
            "--https-listen", "127.0.0.1:0",
            "--https-cors-origin", "https://a.example",
            "--https-cors-origin", "https://b.example, http://localhost:8080",
        )
    )  # fmt: skip
    assert config is not None and config.listen == "127.0.0.1:0"
    assert config.cors_origins == ("https://a.example", "https://b.example", "http://localhost:8080")
    args = _parsed("--https-listen", "127.0.0.1:0")
    args.https_cors_origin = "https://c.example,https://d.example"  # as a config file or env sets it
    assert _https(args).cors_origins == ("https://c.example", "https://d.example")  # type: ignore[union-attr]


def test_an_origin_without_scheme_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="CORS origin"):
        _https(_parsed("--https-listen", "127.0.0.1:0", "--https-cors-origin", "app.example"))
