"""What build is running: the installed package version (for ``--version`` and ``deniable_build_info``)."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    """The installed package version (``0+unknown`` when run from an uninstalled tree)."""
    try:
        return metadata.version("deniable")
    except metadata.PackageNotFoundError:
        return "0+unknown"
