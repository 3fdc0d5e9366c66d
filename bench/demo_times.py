"""Wall time of ``deniable demo --mechanism M`` at its default 20,000 devices, for every mechanism.

    python bench/demo_times.py [--devices 20000] [--timeout 300] [--only grr,rappor]
                               [--json bench-results/demo_times.json]

Each demo runs in a fresh process, one after the other (never in parallel: the machine is the
measurement), with progress bars off. A demo that exceeds ``--timeout`` seconds is stopped and
shown as such; a mechanism the demo refuses (it fits neither demo question) is shown with the
first line of its error. The load average before and after each run is printed beside it: on a
shared machine, say what the load was when quoting a time. Heavy: about 14 mechanisms × 20-60 s.
Results are in docs/performance.md. Nothing here is a test assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from deniable.core import mechanisms


def run_one(mechanism: str, devices: int, timeout: float) -> dict[str, Any]:
    """One demo in a child process: wall seconds, the demo's own elapsed time, status, load."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="demo-times-") as tmp:
        out = Path(tmp) / "demo.json"
        command = [sys.executable, "-m", "deniable.cli", "demo", "--mechanism", mechanism]
        command += ["--devices", str(devices), "--no-progress", "--json", str(out)]
        started = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
            status = "ok" if done.returncode == 0 else _first_error(done.stderr)
        except subprocess.TimeoutExpired:
            status = f"stopped after {timeout:.0f} s"
        wall = time.perf_counter() - started
        report = json.loads(out.read_text()) if out.exists() else {}
    messages = sum(int(c.get("acknowledged", 0) or 0) for c in report.get("campaigns", []))
    return {
        "mechanism": mechanism,
        "wall_s": wall,
        "demo_elapsed_s": report.get("elapsed_s"),
        "messages": messages or None,
        "status": status,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def _first_error(stderr: str) -> str:
    """The last non-empty line of a failed demo's stderr (the error message), shortened."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    return ("error: " + lines[-1])[:100] if lines else "error"


def table(rows: list[dict[str, Any]], devices: int) -> str:
    """The Markdown table for docs/performance.md."""
    lines = [
        f"| mechanism | wall s ({devices:,} devices) | messages (both questions)"
        " | load before → after | status |",
        "|---|---:|---:|---|---|",
    ]
    for r in rows:
        messages = f"{r['messages']:,}" if r["messages"] else "n/a"
        lines.append(
            f"| {r['mechanism']} | {r['wall_s']:.1f} | {messages} |"
            f" {r['load_before']:.1f} → {r['load_after']:.1f} | {r['status']} |"
        )
    return "\n".join(lines)


def main() -> int:
    """Run every (or the chosen) mechanism's demo in turn and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=20_000)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--only", default="", help="comma-separated mechanism names (default: all)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or mechanisms.names()
    rows = []
    for name in names:
        rows.append(run_one(name, args.devices, args.timeout))
        print(f"{name}: {rows[-1]['wall_s']:.1f} s ({rows[-1]['status']})", file=sys.stderr, flush=True)
    print(table(rows, args.devices))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
