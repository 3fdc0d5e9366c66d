"""``deniable bench --protocols``: what the shuffle-only histograms cost a device and the aggregator.

Per mechanism and domain size: messages and sealed bytes per device, device CPU per device
(randomise + encode + seal every message), aggregator CPU per device (open + decode + tally, then
one estimate), and the planner's std error per bucket against central Laplace at the planned n.
A sample of devices is timed (the cost is per device, so the sample size only sets the noise).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from deniable.core import mechanisms
from deniable.core.accounting.planner import central_laplace, device_cost, expected_std_error
from deniable.core.campaigns import layout_for
from deniable.core.crypto import KeyPair, open_report, seal_report
from deniable.core.wire import Plaintext, decode, encode, new_report_id
from deniable.sim import render

CAMPAIGN = "bench-protocols"


@dataclass
class ProtocolConfig:
    """Planned n, target, the mechanisms and domains, and how many messages to time per row."""

    n: int = 100_000
    epsilon: float = 1.0
    delta: float = 1e-6
    mechanisms: tuple[str, ...] = ("flooded_histogram", "multi_message_histogram", "balcer_cheu_histogram")
    domains: tuple[int, ...] = (2, 32, 1024)
    timed_messages: int = 20_000

    @classmethod
    def quick(cls) -> ProtocolConfig:
        return cls(n=5000, domains=(2, 8), timed_messages=600)


@dataclass
class ProtocolRow:
    mechanism: str
    domain: int
    messages_per_device: float
    bytes_per_device: float
    device_cpu_ms: float
    aggregator_cpu_ms: float
    std_error: float
    central_laplace: float
    timed_devices: int
    params: dict[str, float] = field(default_factory=dict)


def _row(name: str, d: int, config: ProtocolConfig, keys: KeyPair) -> ProtocolRow:
    params = {"expected_n": float(config.n), "delta": config.delta}
    randomiser = mechanisms.create(name, epsilon0=config.epsilon, domain_size=d, **params)
    cost = device_cost(randomiser)
    devices = max(2, min(2000, int(config.timed_messages / cost["messages_per_device"])))
    layout = layout_for(randomiser)
    started = time.process_time()
    payloads = randomiser.randomise_many([i % d for i in range(devices)])
    sealed = [
        seal_report(
            encode(Plaintext(new_report_id(), CAMPAIGN, keys.key_id, m), layout.plaintext_length),
            keys.public,
            CAMPAIGN,
        )
        for payload in payloads
        for m in randomiser.split_messages(payload)
    ]
    device_s = time.process_time() - started
    started = time.process_time()
    opened = [decode(open_report(c, keys, CAMPAIGN), layout.plaintext_length).payload for c in sealed]
    tally = randomiser.tally(opened)
    randomiser.estimate(tally.counts.tolist(), randomiser.devices(tally.counts.tolist(), len(opened)))
    aggregator_s = time.process_time() - started
    return ProtocolRow(
        mechanism=name,
        domain=d,
        messages_per_device=cost["messages_per_device"],
        bytes_per_device=cost["bytes_per_device"],
        device_cpu_ms=device_s / devices * 1e3,
        aggregator_cpu_ms=aggregator_s / devices * 1e3,
        std_error=expected_std_error(randomiser, config.n),
        central_laplace=central_laplace(config.epsilon, config.delta, d).std_error,
        timed_devices=devices,
        params=randomiser.parameters(),
    )


def format_rows(rows: list[ProtocolRow], config: ProtocolConfig) -> str:
    lines = [
        f"shuffle-only histograms at n = {config.n}, ε = {config.epsilon:g}, δ = {config.delta:g}"
        " (CPU per device; sealed X25519 HPKE messages)",
        f"{'mechanism':26} {'d':>5} {'msgs/dev':>9} {'bytes/dev':>11} {'device ms':>10} {'aggr. ms':>9}"
        f" {'std err':>8} {'Laplace':>8}",
    ]
    for r in rows:
        lines.append(
            f"{r.mechanism:26} {r.domain:>5} {r.messages_per_device:>9.6g} {r.bytes_per_device:>11,.0f}"
            f" {r.device_cpu_ms:>10.2f} {r.aggregator_cpu_ms:>9.2f} {r.std_error:>8.3g}"
            f" {r.central_laplace:>8.3g}"
        )
    return "\n".join(lines)


def run_protocols(config: ProtocolConfig, json_path: Path | None = None) -> list[dict[str, Any]]:
    """Measure every (mechanism, domain) row, print the table, write JSON if asked."""
    keys = KeyPair.generate(1)
    rows = [_row(name, d, config, keys) for name in config.mechanisms for d in config.domains]
    print(format_rows(rows, config))
    data = [asdict(r) for r in rows]
    render.write_json(data, json_path)
    return data
