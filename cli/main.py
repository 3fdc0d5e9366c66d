"""The ``deniable`` command: one entry point, one subcommand module per job (ADR 0025).

Each ``cli/cmd_*.py`` module adds its parsers with ``set_defaults(handler=run)``; ``main`` parses,
layers the config file and environment under the flags, and calls ``args.handler``. Errors reach
the user as one line on stderr: exit 2 for configuration and usage errors, 1 for a failed remote call.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from deniable.cli import (
    cmd_aggregator,
    cmd_bench,
    cmd_campaign,
    cmd_certs,
    cmd_console,
    cmd_demo,
    cmd_health,
    cmd_keys,
    cmd_loadtest,
    cmd_privacy,
    cmd_query,
    cmd_shuffler,
    cmd_status,
)
from deniable.cli.options import Subparsers
from deniable.core.errors import ConfigurationError


class CommandModule(Protocol):
    """A ``cli/cmd_*.py`` module: adds its subcommands, each with ``set_defaults(handler=...)``."""

    def register(self, sub: Subparsers) -> None: ...


COMMANDS: tuple[CommandModule, ...] = (
    cmd_demo,
    cmd_aggregator,
    cmd_shuffler,
    cmd_campaign,
    cmd_query,
    cmd_keys,
    cmd_bench,
    cmd_certs,
    cmd_health,
    cmd_loadtest,
    cmd_privacy,
    cmd_status,
    cmd_console,
)
"""Every command module, in the order ``deniable --help`` lists them; a new command is one module
here."""


def build_parser() -> argparse.ArgumentParser:
    """The global options and every command module's subcommands."""
    parser = argparse.ArgumentParser(
        prog="deniable", description="Private telemetry in the shuffle model of DP."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.register(sub)
    from deniable.cli import config
    from deniable.core.plumbing.build import version

    config.install(parser, version())
    return parser


# Which extra installs a module the CLI may need (the bare install is the device SDK only).
EXTRA_FOR_MODULE = {
    "numpy": "server",
    "prometheus_client": "server",
    "tqdm": "server",
    "grpc_health": "server",
    "asyncpg": "postgres",
    "aiomqtt": "mqtt",
    "paho": "mqtt",
    "matplotlib": "plot",
    "aiohttp": "console",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run; a missing optional dependency is one line naming its extra."""
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        extra = EXTRA_FOR_MODULE.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(
            f"deniable: this command needs the [{extra}] extra ({exc.name} is not installed):"
            f" pip install 'deniable[{extra}]'",
            file=sys.stderr,
        )
        return 2


def _main(argv: Sequence[str] | None) -> int:
    """Parse arguments, run, and turn known failures into one-line errors."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from deniable.cli import config
    from deniable.core.plumbing.logs import configure_logging

    configure_logging(*config.log_settings(args))
    try:
        args.config_source = config.resolve(parser, argv, args)
        configure_logging(*config.log_settings(args))
        handler: Callable[[argparse.Namespace], int] = args.handler
        status = int(handler(args))
        sys.stdout.flush()  # a closed pipe fails here, inside the handlers below, not at exit
        return status
    except ConfigurationError as exc:
        print(f"deniable: configuration error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"deniable: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        print(f"deniable: {getattr(code, 'name', 'error')}: {details}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (``deniable query ... | head -1``): stop quietly
        _silence_stdout()
        return 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
