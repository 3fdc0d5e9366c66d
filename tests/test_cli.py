"""The ``deniable`` command as a user runs it: demo output, serve subprocesses, one-line errors."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.processes import free_port, wait_listening

from deniable.cli.main import main
from deniable.core.plumbing.mqtt import BrokerAddress

CLI = [sys.executable, "-m", "deniable.cli"]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    """Certificates made the way the README says: ``deniable certs dev``."""
    made = _run("certs", "dev", "--out", str(tmp_path / "certs"))
    assert made.returncode == 0, made.stderr
    return tmp_path / "certs"


CA_OF = {
    "aggregator": "aggregator-clients-ca",  # a service verifies its callers with its bundle
    "shuffler": "shuffler-clients-ca",
    "aggregator-operator": "aggregator-ca",  # a client trusts only the party it reaches
    "shuffler-operator": "shuffler-ca",
}


def _tls(certs: Path, role: str, ca: str | None = None) -> list[str]:
    return [
        "--tls-cert",
        str(certs / f"{role}.pem"),
        "--tls-key",
        str(certs / f"{role}.key"),
        "--tls-ca",
        str(certs / f"{ca or CA_OF[role]}.pem"),
    ]


@pytest.fixture
def services(tmp_path: Path, certs: Path) -> Iterator[tuple[str, str]]:
    """``deniable aggregator serve`` and ``deniable shuffler serve`` as real subprocesses, with TLS;
    yields the aggregator's address and the shuffler's operator (mutual-TLS) address."""
    agg_port, shuf_port, op_port = free_port(), free_port(), free_port()
    agg = subprocess.Popen(
        [
            *CLI,
            "aggregator",
            "serve",
            "--data-dir",
            str(tmp_path / "agg"),
            "--listen",
            f"127.0.0.1:{agg_port}",
            *_tls(certs, "aggregator"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    shuf = subprocess.Popen(
        [
            *CLI,
            "shuffler",
            "serve",
            "--data-dir",
            str(tmp_path / "shuf"),
            "--listen",
            f"127.0.0.1:{shuf_port}",
            "--upstream",
            f"127.0.0.1:{agg_port}",
            "--operator-listen",
            f"127.0.0.1:{op_port}",
            *_tls(certs, "shuffler"),
            "--upstream-ca",
            str(certs / "aggregator-ca.pem"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_listening(agg_port, agg)
        wait_listening(shuf_port, shuf)
        wait_listening(op_port, shuf)
        yield f"127.0.0.1:{agg_port}", f"127.0.0.1:{op_port}"
    finally:
        for proc in (shuf, agg):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(timeout=30) for proc in (shuf, agg)]
        assert codes == [0, 0], "services must exit 0 after SIGTERM (graceful shutdown)"


def test_demo_json_has_the_documented_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    plot = tmp_path / "plot.png"
    assert main(["demo", "--devices", "1200", "--json", str(out), "--plot", str(plot), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert len(bytes.fromhex(report["signing_public_key"])) == 32  # the devices pinned it
    assert "campaigns signed" in capsys.readouterr().out
    kinds = sorted(c["kind"] for c in report["campaigns"])
    assert kinds == ["binary", "histogram"]
    for campaign in report["campaigns"]:
        for key in ("id", "kind", "mechanism", "epsilon0", "central_epsilon", "delta", "n", "buckets"):
            assert key in campaign, key
        assert campaign["n"] == 1200
        assert sum(b["true_count"] for b in campaign["buckets"]) == 1200
        for bucket in campaign["buckets"]:
            for key in ("label", "true_count", "estimate", "std_error", "ci_low", "ci_high"):
                assert key in bucket, key
            assert bucket["ci_low"] <= bucket["estimate"] <= bucket["ci_high"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_operator_commands_against_served_processes(services: tuple[str, str], certs: Path) -> None:
    aggregator, shuffler = services
    operator = _tls(certs, "aggregator-operator")
    shuffler_operator = _tls(certs, "shuffler-operator")
    shuffler_flags = [  # the same files under the --shuffler-tls-* names
        f"--shuffler-{flag[2:]}" if flag.startswith("--") else flag for flag in shuffler_operator
    ]
    created = _run(
        "campaign",
        "create",
        "--aggregator",
        aggregator,
        "--id",
        "lang",
        "--question",
        "Language?",
        "--kind",
        "categorical",
        "--labels",
        "en,es,de",
        "--epsilon0",
        "1.5",
        "--n-min",
        "1",
        "--json",
        *operator,
    )
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["labels"] == ["en", "es", "de"]
    listed = _run("campaign", "list", "--aggregator", aggregator, "--json", *operator)
    assert [c["id"] for c in json.loads(listed.stdout)] == ["lang"]
    flushed = _run("shuffler", "flush", "--shuffler", shuffler, *operator)
    assert flushed.returncode == 1 and "UNAVAILABLE" in flushed.stderr  # not the aggregator's operator
    flushed = _run("shuffler", "flush", "--shuffler", shuffler, *shuffler_operator)
    assert flushed.returncode == 0, flushed.stderr
    windowed = _run(
        "campaign", "create", "--aggregator", aggregator, "--id", "win", "--question", "Q?",
        "--kind", "binary", "--epsilon0", "1", "--n-min", "5", "--batch-target", "20",
        "--window", "2h", "--json", *operator,
    )  # fmt: skip
    assert windowed.returncode == 0, windowed.stderr
    made = json.loads(windowed.stdout)
    assert made["batch_target"] == 20 and made["window_end_unix"] > 0 and not made["closed"]
    half = _run("campaign", "close", "win", "--aggregator", aggregator, "--shuffler", shuffler, *operator)
    assert half.returncode == 2 and "--shuffler-tls-ca" in half.stderr  # the shuffler's credential apart
    closed = _run(
        "campaign", "close", "win", "--aggregator", aggregator, "--shuffler", shuffler, *operator,
        *shuffler_flags,
    )  # fmt: skip
    assert closed.returncode == 0, closed.stderr
    assert "closed win" in closed.stdout
    listed = _run("campaign", "list", "--aggregator", aggregator, "--json", *operator)
    assert {c["id"]: c["closed"] for c in json.loads(listed.stdout)} == {"lang": False, "win": True}
    stolen = _run("campaign", "release-below-n-min", "win", "--aggregator", aggregator,
                  *_tls(certs, "shuffler-operator", "aggregator-ca"))  # fmt: skip
    assert stolen.returncode == 1 and "PERMISSION_DENIED" in stolen.stderr  # the shuffler's party cannot
    released = _run("campaign", "release-below-n-min", "win", "--aggregator", aggregator, *operator)
    assert released.returncode == 0 and "recorded at the aggregator" in released.stdout, released.stderr
    below = _run(
        "shuffler", "flush", "--shuffler", shuffler, "--campaign", "win", "--below-n-min", *shuffler_operator
    )
    assert below.returncode == 0, below.stderr
    answer_win = _run("query", "binary-sum", "win", "--aggregator", aggregator, "--json", *operator)
    assert json.loads(answer_win.stdout)["below_n_min_authorised"] is True
    bad = _run("campaign", "create", "--aggregator", aggregator, "--id", "x", "--question", "Q?",
               "--kind", "binary", "--epsilon0", "1", "--window", "soon", *operator)  # fmt: skip
    assert bad.returncode == 2 and "--window" in bad.stderr
    answer = _run("query", "histogram", "lang", "--aggregator", aggregator, "--json", *operator)
    assert answer.returncode == 0, answer.stderr
    data = json.loads(answer.stdout)
    assert data["n"] == 0 and [b["label"] for b in data["buckets"]] == ["en", "es", "de"]
    missing = _run("query", "binary-sum", "nope", "--aggregator", aggregator, *operator)
    assert missing.returncode == 1
    assert "NOT_FOUND" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    keys = _run("keys", "show", "--aggregator", aggregator, "--json", *operator)
    shown = json.loads(keys.stdout)
    assert keys.returncode == 0 and len(bytes.fromhex(shown["keys"][0]["public_key"])) == 32
    assert len(bytes.fromhex(shown["signing_public_key"])) == 32
    assert shown["keys"][0]["state"] == "active"
    assert set(shown["keys"][0]["campaigns"]) == {"lang", "win"}  # "win": the batch-target campaign above
    shuffler_cert = _tls(certs, "shuffler", "aggregator-ca")  # a valid certificate, not the operator's
    refused = _run("campaign", "list", "--aggregator", aggregator, *shuffler_cert)
    assert refused.returncode == 0  # the shuffler role may read campaigns (it relays them) ...
    refused = _run("query", "histogram", "lang", "--aggregator", aggregator, *shuffler_cert)
    assert refused.returncode == 1 and "PERMISSION_DENIED" in refused.stderr  # ... but not query
    no_cert = _run(
        "query", "histogram", "lang", "--aggregator", aggregator, "--tls-ca", str(certs / "aggregator-ca.pem")
    )
    assert no_cert.returncode == 1 and len(no_cert.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "command",
    [
        ["campaign", "list"],
        ["query", "histogram", "x"],
        ["keys", "show"],
        ["shuffler", "flush"],
        ["aggregator", "serve", "--data-dir", "unused"],
        ["shuffler", "serve", "--data-dir", "unused"],
    ],
)
def test_without_tls_or_insecure_every_command_is_a_one_line_error(command: list[str]) -> None:
    """Plaintext is never a default: neither TLS files nor --insecure is a configuration error."""
    result = _run(*command, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--insecure" in lines[0], result.stderr


def test_key_rotation_hybrid_campaign_close_and_destroy_commands(
    services: tuple[str, str], certs: Path
) -> None:
    """keys rotate / campaign create --kem / campaign close / keys destroy, through the served CLI."""
    aggregator, _ = services
    op = ["--aggregator", aggregator, *_tls(certs, "aggregator-operator")]
    base = [*op, "--kind", "binary", "--question", "q?", "--epsilon0", "1", "--json"]
    assert _run("campaign", "create", "--id", "old", *base).returncode == 0
    rotated = _run("keys", "rotate", *op)
    assert rotated.returncode == 0 and "key 2" in rotated.stdout, rotated.stderr
    hybrid = _run("campaign", "create", "--id", "pq", "--kem", "x25519-mlkem768", *base)
    assert hybrid.returncode == 0, hybrid.stderr
    assert json.loads(hybrid.stdout)["hpke_suite"].startswith("MLKEM768X25519")
    refused = _run("keys", "destroy", "1", *op)
    assert refused.returncode == 1 and "FAILED_PRECONDITION" in refused.stderr and "old" in refused.stderr
    assert _run("campaign", "close", "old", *op).returncode == 0
    assert _run("keys", "destroy", "1", *op).returncode == 0
    states = {
        k["key_id"]: (k["state"], k["kem"])
        for k in json.loads(_run("keys", "show", *op, "--json").stdout)["keys"]
    }
    assert states == {1: ("destroyed", "x25519"), 2: ("active", "x25519"), 3: ("active", "x25519-mlkem768")}


def test_port_taken_is_a_one_line_configuration_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _run(
            "aggregator",
            "serve",
            "--insecure",
            "--data-dir",
            str(tmp_path),
            "--listen",
            f"127.0.0.1:{port}",
            timeout=60,
        )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "configuration error" in lines[0], result.stderr


def test_unusable_data_dir_is_a_configuration_error(tmp_path: Path) -> None:
    """A data directory below a regular file cannot be created, even by root (CI runs as root)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for service in ("aggregator", "shuffler"):
        result = _run(
            service,
            "serve",
            "--insecure",
            "--data-dir",
            str(blocker / "data"),
            "--listen",
            "127.0.0.1:0",
            timeout=60,
        )
        assert result.returncode == 2, (service, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "configuration error" in lines[0], (service, result.stderr)


def test_privacy_mechanisms_lists_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "mechanisms"]) == 0
    out = capsys.readouterr().out
    assert "binary_rr" in out and "grr" in out


def test_bad_arguments_exit_with_usage() -> None:
    result = _run("demo", "--devices", "0")
    assert result.returncode == 2 and "positive" in result.stderr


def test_demo_over_an_mqtt_broker(tmp_path: Path, mqtt_broker: BrokerAddress, mqtt_prefix: str) -> None:
    out = tmp_path / "out.json"
    argv = ["demo", "--devices", "600", "--json", str(out), "--no-progress"]
    assert main([*argv, "--mqtt", str(mqtt_broker), "--mqtt-prefix", mqtt_prefix, "--mqtt-insecure"]) == 0
    report = json.loads(out.read_text())
    assert [c["n"] for c in report["campaigns"]] == [600, 600]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--mqtt", "host:notaport", "--mqtt-insecure"], "MQTT broker port"),
        (["--mqtt", "127.0.0.1:1883", "--mqtt-insecure", "--mqtt-prefix", "a/#"], "topic prefix"),
        (["--mqtt", "127.0.0.1:1883"], "--mqtt-insecure"),  # never silently plaintext (issue 20)
        (["--mqtt", "127.0.0.1:1883", "--mqtt-ca", "/nonexistent/ca.pem"], "CA"),
    ],
)
def test_bad_mqtt_options_are_one_line_configuration_errors(
    tmp_path: Path, options: list[str], words: str
) -> None:
    result = _run(
        "shuffler",
        "serve",
        "--insecure",
        "--data-dir",
        str(tmp_path),
        "--listen",
        "127.0.0.1:0",
        *options,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "configuration error" in lines[0] and words in lines[0], result.stderr
