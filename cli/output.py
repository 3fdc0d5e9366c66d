"""Output shared by several commands: JSON as the CLI prints it, and what a flush did."""

from __future__ import annotations

from typing import Any

from deniable.sim import render
from deniable.v1 import deniable_pb2 as pb


def print_json(data: Any) -> None:
    """``data`` as the CLI's JSON (``deniable.sim.render.dumps``)."""
    print(render.dumps(data))


def flush_line(flushed: pb.FlushResponse) -> str:
    """What a flush did, and any campaign whose window closed with fewer than n_min held."""
    line = (
        f"forwarded {flushed.reports_forwarded} reports in {flushed.batches_forwarded} batches;"
        f" {flushed.reports_held} held"
    )
    for held in flushed.window_held:
        line += (
            f"\nwindow of {held.campaign_id} closed with {held.pending} reports, fewer than n_min"
            f" ({held.n_min}): held (release with --below-n-min --campaign {held.campaign_id})"
        )
    return line
