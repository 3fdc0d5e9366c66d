"""``deniable privacy …``: the mechanisms on offer and the accountant's answers."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``privacy mechanisms`` (and later planning and amplification commands)."""
    privacy = sub.add_parser("privacy", help="mechanisms and accounting").add_subparsers(
        dest="action", required=True
    )
    mechanisms = privacy.add_parser("mechanisms", help="list the randomisers")
    mechanisms.set_defaults(handler=list_mechanisms)


def list_mechanisms(args: argparse.Namespace) -> int:
    """One line per registered randomiser."""
    from deniable.core import mechanisms

    for name, summary in mechanisms.summaries().items():
        print(f"{name:22} {summary}")
    return 0
