"""Device driver of the fault harness: the real ``Reporter`` and SQLite outbox in their own process.

Run by path (``python tests/fault/device.py ...``); SIGKILLed and restarted on the same outbox by
the harness. Every sealed report also enters a ``journal`` table in the same transaction as the
outbox row, so the harness knows every report that ever existed (the outbox forgets acked ones).
The driver exits 0 once ``--reports`` reports are recorded and the outbox is empty.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from deniable.client.outbox import Outbox
from deniable.client.reporter import Reporter
from deniable.client.transport import GrpcTransport, TransportError

JOURNAL = (
    "CREATE TABLE IF NOT EXISTS journal (ciphertext BLOB PRIMARY KEY) WITHOUT ROWID;"
    " CREATE TRIGGER IF NOT EXISTS journal_every_report AFTER INSERT ON outbox"
    " BEGIN INSERT INTO journal (ciphertext) VALUES (NEW.ciphertext); END;"
)
"""A trigger, so every outbox insert is journaled in its own transaction, whichever method made it."""


class JournalOutbox(Outbox):
    """The real outbox, plus a journal of every ciphertext it ever stored (same transaction)."""

    def __init__(self, path: Path) -> None:
        """Open the outbox and its journal table and trigger."""
        super().__init__(path)
        self._conn().executescript(JOURNAL)

    def journaled(self) -> int:
        """How many reports were ever recorded."""
        with self._lock:
            return int(self._conn().execute("SELECT count(*) FROM journal").fetchone()[0])


async def drive(args: argparse.Namespace) -> int:
    """Record reports chunk by chunk and send them until all are acknowledged or time runs out."""
    outbox = JournalOutbox(args.outbox)
    transport = GrpcTransport(args.shuffler, timeout_s=5.0, insecure=True)
    deadline = time.monotonic() + args.give_up_s
    reporter = await Reporter.fetch(
        args.campaign, transport, outbox, insecure_skip_verify=True, give_up_after_s=args.give_up_s
    )
    started, first = time.monotonic(), outbox.journaled()
    while time.monotonic() < deadline:
        recorded = outbox.journaled()
        allowed = args.reports if args.rate <= 0 else first + int((time.monotonic() - started) * args.rate)
        if recorded < min(args.reports, allowed + args.chunk):
            chunk = min(args.chunk, args.reports - recorded)
            reporter.record_many([(recorded + i) % 2 for i in range(chunk)])
            if outbox.journaled() != recorded + chunk:
                print("device: the journal missed reports", file=sys.stderr, flush=True)
                return 2
        try:
            await reporter.send_pending(
                batch_size=args.batch, max_attempts=4, base_delay_s=0.02, max_delay_s=0.3
            )
        except TransportError as exc:  # non-retryable (e.g. a cut stream): the batch stays queued
            print(f"device: {exc.message}", file=sys.stderr, flush=True)
            await asyncio.sleep(0.05)
        if outbox.count() == 0 and outbox.journaled() < args.reports:
            await asyncio.sleep(min(0.2, args.chunk / args.rate) if args.rate > 0 else 0)
        if outbox.journaled() >= args.reports and outbox.count() == 0:
            await transport.close()
            return 0
    print("device: gave up with reports still queued", file=sys.stderr, flush=True)
    return 1


def main() -> int:
    """Parse the driver's options and run it."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--outbox", type=Path, required=True)
    parser.add_argument("--shuffler", required=True)
    parser.add_argument("--campaign", required=True)
    parser.add_argument("--reports", type=int, required=True)
    parser.add_argument("--chunk", type=int, default=500)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--rate", type=float, default=0.0, help="reports per second (0: as fast as possible)")
    parser.add_argument("--give-up-s", type=float, default=600.0)
    return asyncio.run(drive(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
