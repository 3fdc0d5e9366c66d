"""``deniable bench``: throughput against the machine's ceiling, library comparison, memory."""

from __future__ import annotations

import argparse
from pathlib import Path

from deniable.cli.options import Subparsers, positive_int


def register(sub: Subparsers) -> None:
    """Add ``bench``."""
    bench = sub.add_parser(
        "bench",
        help="measure throughput per stage and end to end against the machine's HPKE ceiling",
        description=(
            "Measures the decryption ceiling (HPKE on every core), each stage (device, shuffler"
            " ingest, shuffler permute+forward, aggregator) and the pipeline end to end through"
            " the real services on loopback, as reports/s and as a ratio to the ceiling."
            " See docs/performance.md."
        ),
    )
    bench.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    bench.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of every measurement")
    bench.add_argument(
        "--reports", type=positive_int, default=None, help="reports per stage (default 200000)"
    )
    bench.add_argument(
        "--workers", type=positive_int, default=None, help="processes for HPKE (default: every core)"
    )
    bench.add_argument(
        "--batch", type=positive_int, default=None, help="reports per shuffled batch (default 50000)"
    )
    bench.add_argument(
        "--request-reports",
        type=positive_int,
        default=None,
        help="reports per SubmitReports request from the simulated devices (default 1000)",
    )
    bench.add_argument(
        "--compare-libraries",
        action="store_true",
        help="instead: our randomisers against pure-ldp and multi-freq-ldpy (pip install -e '.[bench]')",
    )
    bench.add_argument(
        "--memory", action="store_true", help="instead: peak RSS of the shuffler and the aggregator"
    )
    bench.add_argument(
        "--protocols",
        action="store_true",
        help="instead: messages, bytes and CPU per device of the shuffle-only histograms (d = 2, 32, 1024)",
    )
    bench.add_argument(
        "--pipeline",
        action="store_true",
        help=(
            "instead: messages/s of multi-message protocols beside reports/s of a single-message"
            " mechanism through the services (--reports messages each)"
        ),
    )
    bench.add_argument(
        "--devices", type=positive_int, default=None, help="n for --compare-libraries/--memory"
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress output")
    bench.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the chosen benchmark: libraries, protocols, memory, pipeline, or throughput (the default)."""
    progress = not args.no_progress
    if args.compare_libraries:
        _compare_libraries(args, progress)
    elif args.protocols:
        _protocols(args)
    elif args.memory:
        _memory(args, progress)
    elif args.pipeline:
        _pipeline(args, progress)
    else:
        _throughput(args, progress)
    return 0


def _compare_libraries(args: argparse.Namespace, progress: bool) -> None:
    """``--compare-libraries``: our randomisers against pure-ldp and multi-freq-ldpy."""
    from deniable.sim.bench_libraries import LibraryConfig, run_comparison

    library_config = LibraryConfig.quick() if args.quick else LibraryConfig()
    if args.devices is not None:
        library_config.devices = args.devices
    run_comparison(library_config, args.json, progress=progress)


def _protocols(args: argparse.Namespace) -> None:
    """``--protocols``: messages, bytes and CPU per device of the shuffle-only histograms."""
    from deniable.sim.bench_protocols import ProtocolConfig, run_protocols

    protocol_config = ProtocolConfig.quick() if args.quick else ProtocolConfig()
    if args.devices is not None:
        protocol_config.n = args.devices
    run_protocols(protocol_config, args.json)


def _memory(args: argparse.Namespace, progress: bool) -> None:
    """``--memory``: peak RSS of the shuffler and the aggregator."""
    from deniable.sim.bench_memory import MemoryConfig, run_memory

    memory_config = MemoryConfig.quick() if args.quick else MemoryConfig()
    if args.devices is not None:
        memory_config.reports = args.devices
    run_memory(memory_config, args.json, progress=progress)


def _pipeline(args: argparse.Namespace, progress: bool) -> None:
    """``--pipeline``: messages/s of multi-message protocols beside a single message's reports/s."""
    from deniable.sim.bench_pipeline import PipelineConfig, run_pipeline_bench

    config = PipelineConfig.quick() if args.quick else PipelineConfig()
    if args.reports is not None:
        config.messages = args.reports
    config.progress = progress
    run_pipeline_bench(config, args.json)


def _throughput(args: argparse.Namespace, progress: bool) -> None:
    """The default: each stage and the pipeline end to end against the HPKE ceiling."""
    from deniable.sim.bench import BenchConfig, run_bench

    config = BenchConfig.quick() if args.quick else BenchConfig()
    if args.reports is not None:
        config.reports = args.reports
    if args.workers is not None:
        config.workers = args.workers
    if args.batch is not None:
        config.batch_reports = args.batch
    if args.request_reports is not None:
        config.request_reports = args.request_reports
    config.progress = progress
    run_bench(config, args.json)
