"""``deniable demo``: the whole pipeline on loopback with simulated devices (``deniable.sim.demo``)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from deniable.cli.options import Subparsers, add_mqtt_options, mqtt_broker, positive_float, positive_int
from deniable.core.plumbing.mqtt import BrokerAddress

if TYPE_CHECKING:
    from deniable.sim.demo import Hold
    from deniable.sim.local import LocalServices


def register(sub: Subparsers) -> None:
    """Add ``demo``."""
    demo = sub.add_parser("demo", help="run the whole pipeline on loopback with simulated devices")
    demo.add_argument(
        "--devices", type=positive_int, default=20_000, help="simulated devices (default 20000)"
    )
    demo.add_argument("--epsilon0", type=positive_float, default=2.0, help="local epsilon (default 2.0)")
    demo.add_argument("--mechanism", default=None, help="randomiser for the histogram campaign (default grr)")
    demo.add_argument(
        "--target-epsilon",
        type=positive_float,
        default=None,
        help="plan ε0 (and the mechanisms unless --mechanism) for this central ε at n = --devices",
    )
    demo.add_argument("--delta", type=float, default=1e-6, help="central δ (default 1e-6)")
    demo.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    demo.add_argument("--plot", type=Path, default=None, help="write a PNG of estimates against the truth")
    demo.add_argument(
        "--workdir", type=Path, default=None, help="keep the services' data here (default: temp)"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_mqtt_options(demo, "devices reach the shuffler through this MQTT broker instead of gRPC")
    demo.add_argument(
        "--console",
        default=None,
        nargs="?",
        const="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="after counting, keep the services and serve the operator console here until Ctrl-C"
        " (default 127.0.0.1:8080; loopback only)",
    )
    demo.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; it prints its own report as it goes."""
    from deniable.sim.demo import run_demo

    with contextlib.suppress(KeyboardInterrupt):
        _run(args, run_demo)
    return 0


def _run(args: argparse.Namespace, run_demo: Callable[..., object]) -> None:
    """``run_demo`` with the options (a function of its own: Ctrl-C ends ``--console``)."""
    run_demo(
        args.devices,
        args.epsilon0,
        args.json,
        args.plot,
        args.mechanism,
        args.workdir,
        progress=not args.no_progress,
        target_epsilon=args.target_epsilon,
        delta=args.delta,
        mqtt_broker=_broker(args),
        mqtt_prefix=args.mqtt_prefix,
        mqtt_insecure=args.mqtt_insecure,
        hold=None if args.console is None else _console(args.console),
    )


def _console(listen: str) -> Hold:
    """``--console``: serve ``deniable.console`` over the demo's services until Ctrl-C."""
    from deniable.console.server import demo_console

    async def hold(services: LocalServices) -> None:
        certs = services.certs
        await demo_console(
            services.aggregator.address,
            certs.client_tls("aggregator", "aggregator-operator"),
            services.shuffler.operator_address,
            certs.client_tls("shuffler", "shuffler-operator"),
            listen,
        )

    return hold


def _broker(args: argparse.Namespace) -> BrokerAddress | None:
    """The demo's broker: TLS with ``--mqtt-ca``, plaintext only with ``--mqtt-insecure``."""
    return None if args.mqtt is None else mqtt_broker(args)
