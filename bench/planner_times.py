"""Wall time of the privacy planner (``deniable.core.accounting.planner.plan``), cold, on a few cases.

    python bench/planner_times.py [--no-scipy] [--only 1] [--json bench-results/planner_times.json]

Each case (target epsilon, delta, n, k) runs in a fresh child process with an empty planner cache,
one after the other (the machine is the measurement); the load average before each is printed
beside it. ``--no-scipy`` makes scipy unimportable in the child, as on a ``[server]`` install (the
service images): since round 16 the accountant never imports scipy, so both times should agree
(ADR 0036). The first case is the one ``tests/core/accounting/test_planner.py`` used to time
(``test_planning_is_fast``, under 20 s). Engine: none, ``plan`` itself. Nothing here is a test
assertion; results are in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deniable.sim.render import write_json

CASES = [  # (target, delta, n, k)
    (1.0, 1e-6, 50_000, 8),  # what test_planning_is_fast timed
    (0.5, 1e-8, 5_000, 4),
    (1.0, 1e-6, 20_000, 8),
    (0.3, 1e-6, 100_000, 16),  # the slow test case (over 300 s with the old per-element tails)
]
CHILD = """
import json, sys, time
if {block}:
    sys.modules["scipy"] = None
from deniable.core.accounting import planner
planner.clear_cache()
started = time.perf_counter()
chosen = planner.plan({target!r}, {delta!r}, {n!r}, {k!r})
print(json.dumps({{"seconds": time.perf_counter() - started, "mechanism": chosen.mechanism,
                  "epsilon0": chosen.epsilon0, "scipy_loaded": "scipy.special" in sys.modules}}))
"""


def run_case(case: tuple[float, float, int, int], block_scipy: bool) -> dict[str, Any]:
    """One cold ``plan`` in a child process: its seconds, choice and the load it started under."""
    target, delta, n, k = case
    load = os.getloadavg()[0]
    code = CHILD.format(block=block_scipy, target=target, delta=delta, n=n, k=k)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    row: dict[str, Any] = {"target": target, "delta": delta, "n": n, "k": k, "load_before": load}
    row["wall_seconds"] = time.perf_counter() - started
    if done.returncode != 0:
        row["error"] = (done.stderr.strip().splitlines() or ["?"])[-1]
    else:
        row.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return row


def main(argv: list[str] | None = None) -> int:
    """Parse options, time each case, print a line per case, optionally write JSON."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--no-scipy", action="store_true", help="scipy unimportable (a [server] install)")
    parser.add_argument("--only", type=int, help="the first N cases only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for case in CASES[: args.only]:
        row = run_case(case, args.no_scipy)
        rows.append(row)
        took = f"{row['seconds']:.1f} s" if "seconds" in row else row["error"]
        print(f"plan{case}: {took} (load {row['load_before']:.1f}, scipy blocked: {args.no_scipy})")
    write_json({"scipy_blocked": args.no_scipy, "cases": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
