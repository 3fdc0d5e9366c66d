"""Devices over an MQTT broker against devices over gRPC: the demo pipeline, timed per transport.

    python bench/mqtt_send.py [--devices 20000] [--repeat 2] [--broker HOST:PORT]
                              [--json bench-results/mqtt.json]

Each run is ``deniable.sim.demo.run_pipeline``: real aggregator and shuffler on loopback, the
SDK's Reporter sending requests of 1,000 sealed reports one after another, over gRPC or through
the broker (``MqttTransport``; the shuffler's ``MqttIngress``). Timed: ``send_s``, from the first
request to the last answer, per campaign. Without ``--broker`` the tests' throwaway mosquitto
(tests/support/mqtt_broker.py; from scripts/system-deps.sh) runs on a free loopback port.
The engine: ``deniable.sim.bench_transport.run_mqtt_send``. Results: docs/mqtt.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from throwaway import mqtt_broker

from deniable.sim.bench_transport import MqttSendConfig, run_mqtt_send
from deniable.sim.render import write_json


def main() -> None:
    """Parse options, run both transports, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--broker", default=None, help="use this broker (default: start a mosquitto)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with mqtt_broker(args.broker) as broker:
        report = run_mqtt_send(MqttSendConfig(args.devices, args.repeat), broker)
    write_json(report, args.json)


if __name__ == "__main__":
    main()
