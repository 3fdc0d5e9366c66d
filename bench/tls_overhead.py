"""What TLS costs on the device link: SubmitReports to a real shuffler, plaintext against TLS.

    python bench/tls_overhead.py [--small 500] [--large 40] [--repeat 3]

One shuffler (and its aggregator) per mode on loopback, per-source quota off; a fresh channel
per mode. Timed: ``--small`` calls of one report each, then ``--large`` calls of 1,000 reports,
one after another (the device's pattern), median of ``--repeat`` runs. Results: docs/security.md.
The engine: ``deniable.sim.bench_transport.run_tls_overhead``.
"""

from __future__ import annotations

import argparse

from deniable.sim.bench_transport import TlsOverheadConfig, run_tls_overhead


def main() -> None:
    """Parse options, time both modes (the engine prints one line per mode)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=500)
    parser.add_argument("--large", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    run_tls_overhead(TlsOverheadConfig(options.small, options.large, options.repeat))


if __name__ == "__main__":
    main()
