"""Peak memory of forming one large release in a spool (ADR 0023; PostgreSQL: ADR 0042).

    python bench/release_memory.py [--messages 1300000] [--per-request 65] [--width 144]
                                   [--postgres [--dsn postgresql://...]]

Fills a fresh ``SegmentSpool`` (with ``--postgres``: a ``PostgresSpool`` on a throwaway server,
tests/support/postgres_server.py, or on ``--dsn``, whose database must be empty) with requests of
``--per-request`` messages of ``--width`` bytes (a multi-message campaign), then forms the whole
release as chunks under the 48 MiB byte limit with one permutation. Prints the process's peak RSS
(ru_maxrss) before and after forming, in MiB. Run it in a fresh process: the peak is per
process. Nothing here is a test assertion.
The engine: ``deniable.sim.bench_release.run_release_memory``.
"""

from __future__ import annotations

import argparse

from throwaway import postgres

from deniable.sim.bench_release import ReleaseMemoryConfig, run_release_memory


def main() -> None:
    """Fill, form, print."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_300_000)
    parser.add_argument("--per-request", type=int, default=65)
    parser.add_argument("--width", type=int, default=144)
    parser.add_argument("--postgres", action="store_true", help="the PostgreSQL spool instead of SQLite")
    parser.add_argument("--dsn", default=None, help="with --postgres: this server, not a throwaway one")
    args = parser.parse_args()
    config = ReleaseMemoryConfig(args.messages, args.per_request, args.width)
    if args.postgres:
        with postgres(args.dsn) as dsn:
            r = run_release_memory(config, dsn)
    else:
        r = run_release_memory(config)
    print(
        f"{r['spool']}: {r['messages']} messages ({r['ciphertext_mib']:.0f} MiB of ciphertexts)"
        f" in {r['chunks']} chunks,"
        f" formed in {r['form_s']:.1f} s"
    )
    print(
        f"peak RSS after filling {r['peak_mib_filled']:.0f} MiB,"
        f" after forming the release {r['peak_mib_formed']:.0f} MiB"
    )


if __name__ == "__main__":
    main()
