"""Devices over an MQTT broker against devices over gRPC: the demo pipeline, timed per transport.

    python bench/mqtt_send.py [--devices 20000] [--repeat 2] [--broker HOST:PORT]
                              [--json bench-results/mqtt.json]

Each run is ``deniable.sim.demo.run_pipeline``: real aggregator and shuffler on loopback, the
SDK's Reporter sending requests of 1,000 sealed reports one after another, over gRPC or through
the broker (``MqttTransport``; the shuffler's ``MqttIngress``). Timed: ``send_s``, from the first
request to the last answer, per campaign. Without ``--broker`` the tests' throwaway mosquitto
(tests/support/mqtt_broker.py; from
scripts/system-deps.sh) runs on a free loopback port. Results: docs/mqtt.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.sim.demo import run_pipeline


def load_mqtt_broker() -> ModuleType:
    """tests/support/mqtt_broker.py (the tests' broker), loaded by path: ``tests`` is not a package."""
    path = Path(__file__).resolve().parents[1] / "tests" / "support" / "mqtt_broker.py"
    spec = importlib.util.spec_from_file_location("deniable_tests_mqtt_broker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        mosquitto = None
        if args.broker is None:
            mosquitto = load_mqtt_broker().Mosquitto(Path(tmp) / "mosquitto")
            mosquitto.start()
            broker = mosquitto.address
        else:
            broker = BrokerAddress.parse(args.broker)
        try:
            for repeat in range(args.repeat):
                for transport, address in (("grpc", None), ("mqtt", broker)):
                    workdir = Path(tmp) / f"{transport}-{repeat}"
                    campaigns = asyncio.run(
                        run_pipeline(
                            args.devices,
                            2.0,
                            workdir,
                            progress=False,
                            mqtt_broker=address,
                            mqtt_insecure=address is not None and address.tls is None,  # the test broker
                        )
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
            if mosquitto is not None:
                mosquitto.stop()
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"devices": args.devices, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
