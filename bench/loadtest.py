"""Simulated devices through the real services: throughput, latency, rejections, accuracy, plots.

    python bench/loadtest.py [--devices 100000] [--pattern constant|bursts|diurnal]
                             [--rate R | --duration S] [--out loadtest-results]
                             [--shuffler 127.0.0.1:7701 --aggregator 127.0.0.1:7700]

The same as ``deniable loadtest``; the engine is ``deniable.sim.loadtest``. See docs/performance.md.
"""

from __future__ import annotations

import sys

from deniable.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["loadtest", *sys.argv[1:]]))
