"""Devices over an MQTT broker against devices over gRPC: the demo pipeline, timed per transport.

    python bench/mqtt_send.py [--devices 20000] [--repeat 2] [--broker HOST:PORT]
                              [--json bench-results/mqtt.json]

Each run is ``deniable.cli.demo.run_pipeline``: real aggregator and shuffler on loopback, the
SDK's Reporter sending requests of 1,000 sealed reports one after another, over gRPC or through
the broker (``MqttTransport``; the shuffler's ``MqttIngress``). Timed: ``send_s``, from the first
request to the last answer, per campaign. Without ``--broker`` a throwaway mosquitto (from
scripts/system-deps.sh) runs on a free loopback port with TCP_NODELAY. Results: docs/mqtt.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from deniable.cli.demo import run_pipeline
from deniable.core.mqtt import BrokerAddress


def start_mosquitto(directory: Path) -> tuple[subprocess.Popen[bytes], BrokerAddress]:
    """A mosquitto on a free loopback port, listening before this returns."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    config = directory / "mosquitto.conf"
    config.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\npersistence false\n"
    )
    config.chmod(0o644)
    process = subprocess.Popen([binary, "-c", str(config)], stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, BrokerAddress("127.0.0.1", port)
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("mosquitto did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--broker", default=None, help="use this broker (default: start a mosquitto)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="deniable-mqtt-bench-") as tmp:
        process = None
        if args.broker is None:
            process, broker = start_mosquitto(Path(tmp))
        else:
            broker = BrokerAddress.parse(args.broker)
        try:
            for repeat in range(args.repeat):
                for transport, address in (("grpc", None), ("mqtt", broker)):
                    workdir = Path(tmp) / f"{transport}-{repeat}"
                    campaigns = asyncio.run(
                        run_pipeline(args.devices, 2.0, workdir, progress=False, mqtt_broker=address)
                    )
                    send_s = [c.timings["send_s"] for c in campaigns]
                    counted = [c.answer.n if c.answer else 0 for c in campaigns]
                    rate = sum(counted) / sum(send_s)
                    runs.append(
                        {"transport": transport, "send_s": send_s, "counted": counted, "reports_per_s": rate}
                    )
                    print(
                        f"{transport}: send {', '.join(f'{s:.2f}' for s in send_s)} s; {rate:,.0f} reports/s"
                    )
        finally:
            if process is not None:
                process.terminate()
                process.wait(5)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"devices": args.devices, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
