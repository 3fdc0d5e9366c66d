"""A real MQTT broker (Debian's mosquitto) on loopback, for the tests and bench/mqtt_send.py.

Loaded by path (``tests`` is not a package under importlib mode). The broker runs without
persistence, on a free port, with TCP_NODELAY (without it a QoS 1 round trip takes ~47 ms
instead of ~0.5 ms: facts.md). mosquitto is installed by scripts/system-deps.sh.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from deniable.core.plumbing.mqtt import BrokerAddress
from support.processes import free_port


class MosquittoUnavailable(RuntimeError):
    """The mosquitto binary is not installed."""


class Mosquitto:
    """One mosquitto process on 127.0.0.1:``port``; ``stop`` and ``start`` again keep the port."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(binary).exists():
            raise MosquittoUnavailable("mosquitto is not installed: run scripts/system-deps.sh")
        self.binary = binary
        self.port = port or free_port()
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "mosquitto.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n"
            "persistence false\nlog_dest stderr\n"
        )
        self.config.chmod(0o644)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> BrokerAddress:
        """Where clients connect."""
        return BrokerAddress("127.0.0.1", self.port)

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the broker and wait until it accepts connections."""
        log = (self.directory / "mosquitto.log").open("ab")
        self.process = subprocess.Popen([self.binary, "-c", str(self.config)], stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mosquitto exited at start: see {self.directory / 'mosquitto.log'}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on port {self.port} within {timeout_s} s")

    def stop(self) -> None:
        """Stop the broker (its retained messages go with it: no persistence)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
