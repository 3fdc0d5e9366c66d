"""Full kill harness from the command line (run from the repository root):

    nice -n 10 python -m tests.fault.run --kills 300 --reports 100000

Its last line: ``kills=… acknowledged=… counted=… duplicates=… lost=…``; exit 1 if anything was
lost, duplicated or unknown, or a process outlived the run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: where ``support`` lives
from support import fault_harness as harness


def main(argv: list[str] | None = None) -> int:
    """Parse options, run once, print the summary line last."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=300, help="SIGKILLs to deliver (default 300)")
    parser.add_argument(
        "--reports", type=int, default=100_000, help="reports the device sends (default 100000)"
    )
    parser.add_argument("--seed", type=int, default=20261126, help="seed of the kill schedule")
    parser.add_argument(
        "--drop", type=float, default=0.02, help="chunk drop probability per hop and direction"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep data and logs here")
    args = parser.parse_args(argv)
    options = harness.Options(
        kills=args.kills,
        reports=args.reports,
        seed=args.seed,
        drop_request=args.drop,
        drop_response=args.drop,
        give_up_s=3600.0,
    )
    root = args.workdir or Path(tempfile.mkdtemp(prefix="deniable-fault-"))
    summary = asyncio.run(harness.run(root, options, progress=lambda s: print(s, flush=True)))
    print(f"data and logs: {root}")
    print(summary.line())
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
