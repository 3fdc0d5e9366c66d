"""Installed size and import cost of the SDK: build the wheel, install it into a fresh venv, measure.

Usage: python bench/sdk_footprint.py [--extras server] [--repeat 5]
Prints the site-packages size (MB, with every dependency), the distributions installed, the
number of modules ``import deniable.client`` loads and its median wall time over ``--repeat``
runs (each in a new interpreter). Reuses the pip cache; needs the network or a local index.
The engine: ``deniable.sim.bench_footprint.run_footprint``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from deniable.sim.bench_footprint import FootprintConfig, run_footprint

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    """Measure one installation and print a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--extras", default="")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(run_footprint(FootprintConfig(ROOT, args.extras, args.repeat))))


if __name__ == "__main__":
    main()
