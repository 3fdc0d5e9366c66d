"""Service configuration: flags > DENIABLE_* environment > TOML file > defaults; the samples in
deploy/config/ load; --version; global options before or after the subcommand; every option's
help states its default; services say where they listen, with TLS state and config source."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deniable.cli import config
from deniable.cli.main import build_parser, main
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.build import version

SAMPLES = Path(__file__).parents[2] / "deploy" / "config"


def resolved(argv: list[str], environ: dict[str, str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` and merge file and environment as ``deniable`` does."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.config_source = config.resolve(parser, argv, args, environ or {})
    return args


@pytest.mark.parametrize("service", ["aggregator", "shuffler"])
def test_the_sample_config_of_each_service_loads(service: str) -> None:
    args = resolved([service, "serve", "--config", str(SAMPLES / f"{service}.toml")])
    assert args.data_dir == Path(f"/var/lib/deniable/{service}")
    assert args.tls_cert == Path(f"/etc/deniable/tls/{service}.pem")
    assert args.listen.startswith("0.0.0.0:")
    assert args.log_format == "json"
    assert args.config_source.describe() == f"file {SAMPLES / f'{service}.toml'}"


def test_flags_beat_environment_beat_file_beat_defaults(tmp_path: Path) -> None:
    file = tmp_path / "agg.toml"
    file.write_text('listen = "127.0.0.1:1001"\ndata_dir = "/from/file"\nkey_drain_s = 5\n')
    base = ["aggregator", "serve"]
    assert resolved([*base, "--data-dir", "d"]).listen == "127.0.0.1:7700"  # default
    assert resolved([*base, "--config", str(file)]).listen == "127.0.0.1:1001"  # file
    env = {"DENIABLE_LISTEN": "127.0.0.1:1002"}
    assert resolved([*base, "--config", str(file)], env).listen == "127.0.0.1:1002"  # env over file
    flags = [*base, "--config", str(file), "--listen", "127.0.0.1:1003"]
    args = resolved(flags, env)
    assert args.listen == "127.0.0.1:1003"  # flag over env
    assert args.data_dir == Path("/from/file")
    assert args.key_drain_s == 5.0  # a TOML integer for a float option
    assert args.config_source.describe() == f"file {file} + env DENIABLE_LISTEN + flags --listen"


def test_the_config_file_may_come_from_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "s.toml"
    file.write_text('data_dir = "/spool"\nquota_per_source = 7\n')
    args = resolved(["shuffler", "serve"], {"DENIABLE_CONFIG": str(file), "DENIABLE_QUOTA_WINDOW": "60"})
    assert (args.data_dir, args.insecure, args.quota_per_source, args.quota_window) == (
        Path("/spool"),
        False,
        7,
        60.0,
    )


@pytest.mark.parametrize("service", ["aggregator", "shuffler"])
@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ("insecure = true\n", {}, "insecure is refused: .* pass --insecure"),
        ("insecure = false\n", {}, "insecure is refused"),
        ("", {"DENIABLE_INSECURE": "yes"}, "DENIABLE_INSECURE is refused: .* pass --insecure"),
        ("mqtt_insecure = true\n", {}, "pass --mqtt-insecure"),
        ("", {"DENIABLE_MQTT_INSECURE": "1"}, "pass --mqtt-insecure"),
    ],
)
def test_plaintext_is_chosen_only_on_the_command_line(
    tmp_path: Path, service: str, text: str, environ: dict[str, str], expected: str
) -> None:
    """Issue 20 item 9: a variable or a config file never switches a link to plaintext; the same
    setting typed as a flag does (the control)."""
    if "mqtt" in (text + str(environ)).lower() and service == "aggregator":
        pytest.skip("the aggregator has no MQTT face")
    file = tmp_path / "s.toml"
    file.write_text(text)
    argv = [service, "serve", "--data-dir", "d", "--config", str(file)]
    with pytest.raises(ConfigurationError, match=expected) as err:
        resolved(argv, environ)
    assert "\n" not in str(err.value)
    file.write_text("")
    assert resolved([*argv, "--insecure"]).insecure is True


def test_global_options_work_before_and_after_the_subcommand_and_in_the_file(tmp_path: Path) -> None:
    before = resolved(
        ["--log-level", "debug", "--log-format", "text", "aggregator", "serve", "--data-dir", "d"]
    )
    after = resolved(
        ["aggregator", "serve", "--data-dir", "d", "--log-level", "debug", "--log-format", "text"]
    )
    assert (before.log_level, before.log_format) == (after.log_level, after.log_format) == ("debug", "text")
    file = tmp_path / "a.toml"
    file.write_text('log_level = "error"\n')
    from_file = resolved(["aggregator", "serve", "--data-dir", "d", "--config", str(file)])
    assert config.log_settings(from_file) == ("error", True)
    flag_first = resolved(
        ["--log-level", "debug", "aggregator", "serve", "--data-dir", "d", "--config", str(file)]
    )
    assert flag_first.log_level == "debug"  # a flag before the subcommand still beats the file
    assert config.log_settings(resolved(["aggregator", "serve", "--data-dir", "d"])) == ("info", True)
    assert config.log_settings(resolved(["campaign", "list", "--insecure"])) == ("warning", True)


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ("nonsense = 1\n", {}, "unknown setting 'nonsense'"),
        ("spool_store = 'postgresql://u:pw@h/db'\n", {}, "belongs in \\$DENIABLE_SPOOL_STORE"),
        ("listen = [1]\n", {}, "expected a single value"),
        ("quota_per_source = 'many'\n", {}, "quota_per_source"),
        ("this is not toml\n", {}, "not valid TOML"),
        ("", {"DENIABLE_QUOTA_WINDOW": "maybe"}, "DENIABLE_QUOTA_WINDOW"),
        ("", {"DENIABLE_LOG_LEVEL": "loud"}, "DENIABLE_LOG_LEVEL"),
    ],
)
def test_bad_settings_are_one_line_errors(
    tmp_path: Path, text: str, environ: dict[str, str], expected: str
) -> None:
    file = tmp_path / "bad.toml"
    file.write_text(text)
    with pytest.raises(ConfigurationError, match=expected) as err:
        resolved(["shuffler", "serve", "--data-dir", "d", "--config", str(file)], environ)
    assert "\n" not in str(err.value)


def test_a_required_option_may_come_from_any_source_but_must_come(capsys: pytest.CaptureFixture[str]) -> None:
    assert resolved(["aggregator", "serve"], {"DENIABLE_DATA_DIR": "/x"}).data_dir == Path("/x")
    with pytest.raises(ConfigurationError, match="--data-dir is required"):
        resolved(["aggregator", "serve"])
    assert main(["aggregator", "serve", "--insecure"]) == 2
    assert "--data-dir is required" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"deniable {version()}"


def test_every_option_has_help_that_states_its_default() -> None:
    """Walks every (sub)command: an option added without help or default text fails here."""
    missing = []
    for parser in config._parsers(build_parser()):
        for action in parser._actions:
            if not action.option_strings or action.dest in ("help", "version"):
                continue
            text = (action.help or "") % {"default": action.default}
            words = text.lower()
            if text.startswith("(") or not ("default" in words or "required" in words):
                missing.append(f"{parser.prog} {action.option_strings[-1]}: {text!r}")
    assert not missing, "\n".join(missing)


def test_a_service_says_where_it_listens_with_tls_state_and_config_source(tmp_path: Path) -> None:
    """INFO is visible by default for services: the start line names address, TLS and sources."""
    file = tmp_path / "agg.toml"
    file.write_text(f'data_dir = "{tmp_path / "agg"}"\nlisten = "127.0.0.1:0"\n')
    env = {**os.environ, "DENIABLE_DECRYPT_WORKERS": "0"}
    command = [
        sys.executable,
        "-m",
        "deniable.cli",
        "aggregator",
        "serve",
        "--config",
        str(file),
        "--insecure",
    ]
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert process.stderr is not None
            lines = []
            for line in process.stderr:
                lines.append(line)
                if "listening on" in line:
                    break
            start = lines[-1]
        finally:
            process.terminate()
            process.wait(timeout=30)
    assert '"level": "info"' in start and '"ts": "' in start
    assert "aggregator listening on 127.0.0.1:" in start
    assert "plaintext (insecure)" in start
    assert f"config: file {file} + env DENIABLE_DECRYPT_WORKERS + flags --insecure" in start
