"""Service configuration: a TOML file, ``DENIABLE_*`` environment variables and flags.

Precedence, highest first: flags > environment > file > built-in defaults. File keys and
environment names are the options' own names (``--data-dir`` → ``data_dir`` / ``DENIABLE_DATA_DIR``),
so one table (``deniable <service> serve --help``) documents all three. Also installs the global
options (``--version``, ``--log-level``, ``--log-format``), accepted before or after the subcommand.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.logs import FORMATS, LEVELS

ENV_PREFIX: Final = "DENIABLE_"
CONFIG_ENV: Final = "DENIABLE_CONFIG"
SERVICES: Final = ("aggregator", "shuffler")
"""Commands ``<service> serve`` that read a config file."""
GLOBAL: Final = ("log_level", "log_format")
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})
_NOT_CONFIGURABLE: Final = frozenset({"help", "version", "config", "command", "action"})
OWN_SOURCES: Final = frozenset({"store", "store_file", "spool_store", "spool_store_file"})
"""Database DSNs: the service reads their flags, then $DENIABLE_<NAME>, then $DENIABLE_<NAME>_FILE
itself (cli/options.py, docs/storage.md); they stay out of the file so that order holds and no
password lands in a config file."""
COMMAND_LINE_ONLY: Final = frozenset({"insecure", "mqtt_insecure"})
"""Plaintext switches: only a flag typed on the command line turns them on, never a file or the
environment, so that no stray variable or copied config makes a link plaintext (ADR 0030)."""


@dataclass(frozen=True)
class Source:
    """Where a service's settings came from, for its start-up log line."""

    file: Path | None
    env: tuple[str, ...]
    flags: tuple[str, ...]

    def describe(self) -> str:
        """E.g. ``file /etc/deniable/aggregator.toml + env DENIABLE_STORE + flags --listen``."""
        parts = [f"file {self.file}"] if self.file else []
        parts += [f"env {', '.join(self.env)}"] if self.env else []
        parts += [f"flags {', '.join('--' + f.replace('_', '-') for f in self.flags)}"] if self.flags else []
        return " + ".join(parts) or "defaults"


COMMON_HELP: Final = {
    "aggregator": "the aggregator's address, host:port",
    "listen": "address to serve gRPC on, host:port (port 0: any free port)",
    "data_dir": "directory for this service's state (keys, database or spool)",
    "json": "print JSON instead of text",
    "id": "campaign id (letters, digits, -_.)",
    "question": "the question devices answer, shown to people",
    "kind": "binary (yes/no) or categorical (--labels)",
    "delta": "central δ of the privacy guarantee",
    "confidence": "confidence level of the intervals",
    "kem": "HPKE KEM of the new key (x25519-mlkem768: post-quantum hybrid)",
    "mechanism": "randomiser (see `deniable privacy plan`)",
    "epsilon0": "local ε0 of every report",
    "n": "reports shuffled together",
    "metrics_port": "serve Prometheus /metrics on this port",
}
"""Help for options declared without any (the same meaning wherever they appear)."""


def install(parser: argparse.ArgumentParser, version: str) -> None:
    """``--version``; ``--log-level``/``--log-format`` on every (sub)command; ``--config`` on services;
    every option's help ends with its default."""
    parser.add_argument("--version", action="version", version=f"deniable {version}")
    for target in _parsers(parser):
        top = target is parser
        target.add_argument(
            "--log-level",
            choices=LEVELS,
            default=None if top else argparse.SUPPRESS,
            help="log level (default: info for services, warning for other commands)",
        )
        target.add_argument(
            "--log-format",
            choices=FORMATS,
            default="json" if top else argparse.SUPPRESS,
            help="json lines or text on stderr (default: json)",
        )
    for service in SERVICES:
        serve = _subparser(parser, service, "serve")
        if serve is None:
            continue
        serve.add_argument(
            "--config",
            type=Path,
            default=None,
            help=f"TOML settings file (default: ${CONFIG_ENV}, else none); precedence flags > env > file",
        )
        serve.set_defaults(config_service=service)
        serve.epilog = (
            "Every option can also come from the --config TOML file (key: the option's name with"
            " underscores, e.g. data_dir) or the environment (DENIABLE_DATA_DIR)."
            " Precedence: flags > environment > file > defaults. Samples: deploy/config/."
        )
        for action in serve._actions:  # required only after file and environment are merged
            if action.required and action.option_strings:
                action.required = False
                action.help = (
                    f"{action.help or COMMON_HELP.get(action.dest, '')} (required: flag, env or file)"
                )
                serve.set_defaults(**{f"_required_{action.dest}": True})
    for target in _parsers(parser):
        for action in target._actions:
            if action.option_strings and action.dest not in ("help", "version"):
                action.help = with_default(action)


def with_default(action: argparse.Action) -> str:
    """The option's help (or the common one for its name) ending with its default."""
    text = action.help if action.help not in (None, argparse.SUPPRESS) else COMMON_HELP.get(action.dest, "")
    text = str(text or "")
    if "default" in text.lower() or "required" in text.lower():
        return text
    if action.required:
        suffix = "required"
    elif isinstance(action, argparse._StoreTrueAction):
        suffix = "default: off"
    elif action.default is None or action.default == []:
        suffix = "default: none"
    else:
        suffix = "default: %(default)s"
    return f"{text} ({suffix})" if text else f"({suffix})"


def resolve(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
) -> Source | None:
    """Merge file and environment into ``args`` under the flags (services only); the source, or None."""
    service = getattr(args, "config_service", None)
    if service is None:
        return None
    environ = os.environ if environ is None else environ
    serve = _subparser(parser, service, "serve")
    assert serve is not None
    actions = {a.dest: a for a in serve._actions if a.option_strings and a.dest not in _NOT_CONFIGURABLE}
    given = explicit(parser, argv)
    path = args.config or (Path(environ[CONFIG_ENV]) if environ.get(CONFIG_ENV) else None)
    from_file = _load(path, actions) if path else {}
    _refuse_plaintext_settings(environ, actions)
    from_env = {
        dest: convert(actions[dest], environ[name], name)
        for dest in actions
        if (name := ENV_PREFIX + dest.upper()) in environ and dest not in OWN_SOURCES
    }
    for dest, value in (from_file | from_env).items():
        if dest not in given:
            setattr(args, dest, value)
    _check_required(args, actions)
    return Source(path, tuple(ENV_PREFIX + d.upper() for d in from_env), tuple(sorted(given & set(actions))))


def _refuse_plaintext_settings(environ: Mapping[str, str], actions: Mapping[str, argparse.Action]) -> None:
    """ConfigurationError for a plaintext switch in the environment (flag only, ``COMMAND_LINE_ONLY``)."""
    for dest in COMMAND_LINE_ONLY & set(actions):
        if ENV_PREFIX + dest.upper() in environ:
            raise ConfigurationError(_plaintext_refusal(f"${ENV_PREFIX}{dest.upper()}", dest))


def _plaintext_refusal(where: str, dest: str) -> str:
    flag = "--" + dest.replace("_", "-")
    return (
        f"{where} is refused: plaintext is chosen only on the command line; pass {flag}"
        " (tests only) or configure TLS"
    )


def explicit(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The option destinations the command line itself set (so nothing may override them)."""
    saved: list[tuple[argparse.Action, Any, bool]] = []
    for target in _parsers(parser):
        for action in target._actions:
            if action.option_strings and action.dest not in ("help", "version"):
                saved.append((action, action.default, action.required))
                action.default, action.required = argparse.SUPPRESS, False
    try:
        seen = parser.parse_args(argv)
    finally:
        for action, default, required in saved:
            action.default, action.required = default, required
    return {k for k in vars(seen) if k not in _NOT_CONFIGURABLE}


def convert(action: argparse.Action, raw: object, where: str) -> Any:
    """A file or environment value as the flag would have parsed it; one-line error otherwise."""
    try:
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            value: Any = _boolean(raw)
        elif isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise ValueError(f"expected a single value, got {raw!r}")
        elif action.type is not None:
            value = action.type(str(raw))  # type: ignore[operator]
        elif isinstance(raw, str):
            value = raw
        else:
            raise ValueError(f"expected a string, got {raw!r}")
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigurationError(f"{where}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


def _boolean(raw: object) -> bool:
    """A TOML boolean or an environment word (1/true/yes/on, 0/false/no/off) as a bool."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE | _FALSE:
        return text in _TRUE
    raise ValueError(f"expected true or false, got {raw!r}")


def _load(path: Path, actions: Mapping[str, argparse.Action]) -> dict[str, Any]:
    """The file's settings, checked against the service's options (unknown keys are errors)."""
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"config file {path} is not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    for key, raw in table.items():
        dest = key.replace("-", "_")
        if dest in OWN_SOURCES:
            raise ConfigurationError(
                f"config file {path}: {key} belongs in ${ENV_PREFIX}{dest.upper()}"
                f" or --{key.replace('_', '-')}, not in the file (it may hold a password)"
            )
        if dest in COMMAND_LINE_ONLY:
            raise ConfigurationError(_plaintext_refusal(f"config file {path}: {key}", dest))
        if dest not in actions:
            raise ConfigurationError(f"config file {path}: unknown setting {key!r}")
        values[dest] = convert(actions[dest], raw, f"config file {path}: {key}")
    return values


def _check_required(args: argparse.Namespace, actions: Mapping[str, argparse.Action]) -> None:
    """ConfigurationError naming the flag, variable and key of a required setting none of them gave."""
    for dest in actions:
        if getattr(args, f"_required_{dest}", False) and getattr(args, dest, None) is None:
            flag = "--" + dest.replace("_", "-")
            raise ConfigurationError(
                f"{flag} is required (or {ENV_PREFIX}{dest.upper()}, or {dest} in the --config file)"
            )


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand parser under it, depth first."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from _parsers(child)


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser | None:
    """The subcommand parser at ``path`` (e.g. ``aggregator serve``), or None."""
    for name in path:
        found = None
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                found = action.choices[name]
        if found is None:
            return None
        parser = found
    return parser


def log_settings(args: argparse.Namespace) -> tuple[str, bool]:
    """(level, json) for ``configure_logging``: services default to info so their start is visible."""
    level = getattr(args, "log_level", None) or ("info" if hasattr(args, "config_service") else "warning")
    return level, getattr(args, "log_format", "json") == "json"
