"""``deniable loadtest``: simulated devices through the real services, with a live progress bar."""

from __future__ import annotations

import argparse
from pathlib import Path

from deniable.cli.options import Subparsers, positive_float, positive_int


def register(sub: Subparsers) -> None:
    """Add ``loadtest``."""
    from deniable.sim.loadtest import PATTERNS

    load = sub.add_parser(
        "loadtest",
        help="drive a population of simulated devices through the real services",
        description=(
            "Seals one report per simulated device (every core), then sends them with a realistic"
            " arrival pattern through the shuffler to the aggregator, on loopback. Prints throughput"
            " over time, acknowledgement latency percentiles, rejections and accuracy against the"
            " truth; writes throughput.png, latency.png and estimates.png. Give two of --devices,"
            " --rate, --duration (defaults: 100000 devices over 60 s). Millions of devices work:"
            " sealing takes about 50 s per million on two cores, and about 200 bytes of memory per"
            " device. See docs/performance.md."
        ),
    )
    load.add_argument("--devices", type=positive_int, default=None, help="simulated devices (default 100000)")
    load.add_argument(
        "--pattern", choices=PATTERNS, default="constant", help="arrival pattern (default constant)"
    )
    load.add_argument("--rate", type=positive_float, default=None, help="mean arrivals per second")
    load.add_argument(
        "--duration", type=positive_float, default=None, help="seconds of arrivals (default 60)"
    )
    load.add_argument(
        "--shuffler", default=None, help="a running shuffler (loopback) instead of starting one"
    )
    load.add_argument("--aggregator", default=None, help="its aggregator (loopback), with --shuffler")
    load.add_argument(
        "--buckets", type=positive_int, default=8, help="categories of the question (default 8)"
    )
    load.add_argument("--mechanism", default="grr", help="randomiser (default grr)")
    load.add_argument("--epsilon0", type=positive_float, default=1.0, help="local epsilon (default 1)")
    load.add_argument(
        "--request-reports", type=positive_int, default=1000, help="most reports per request (default 1000)"
    )
    load.add_argument("--concurrency", type=positive_int, default=8, help="requests in flight (default 8)")
    load.add_argument("--workers", type=positive_int, default=None, help="sealing/decryption processes")
    load.add_argument("--out", type=Path, default=Path("loadtest-results"), help="where the plots go")
    load.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    load.add_argument("--workdir", type=Path, default=None, help="keep the services' data here")
    load.add_argument(
        "--grace",
        type=positive_float,
        default=None,
        help="seconds allowed after --duration (default max(60, duration))",
    )
    load.add_argument(
        "--transport",
        choices=("grpc", "https", "h2", "http"),
        default="grpc",
        help="how devices reach the shuffler: its gRPC device port, its HTTPS face (TLS; https: HTTP/1.1,"
        " h2: HTTP/2, needs httpx[http2]), or that face in plaintext like the benchmark's gRPC"
        " (default grpc; https/h2/http start their own services)",
    )
    load.add_argument("--no-progress", action="store_true", help="no progress bars")
    load.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Build the configuration and run."""
    from deniable.sim.loadtest import LoadConfig, resolve_timing, run_loadtest

    devices, duration = resolve_timing(args.devices, args.rate, args.duration)
    config = LoadConfig(
        devices=devices,
        pattern=args.pattern,
        duration_s=duration,
        shuffler=args.shuffler,
        aggregator=args.aggregator,
        buckets=args.buckets,
        epsilon0=args.epsilon0,
        mechanism=args.mechanism,
        request_reports=args.request_reports,
        concurrency=args.concurrency,
        out_dir=args.out,
        json_path=args.json,
        workdir=args.workdir,
        progress=not args.no_progress,
        grace_s=args.grace,
        transport=args.transport,
    )
    if args.workers is not None:
        config.workers = args.workers
    run_loadtest(config)
    return 0
