"""The whole pipeline on one machine: real services on loopback, real HPKE, real SQLite.

Starts an aggregator and a shuffler on free loopback ports in a temporary directory, creates a
binary and an 8-bucket histogram campaign with known true distributions, runs simulated devices
through the client SDK (randomise → encode → seal → outbox → gRPC), closes the campaigns (the
shuffler releases every device in one batch: the batch target is the number of devices), queries
the aggregator and compares the estimates and the stated central ε with the plan for that n.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from deniable.client import Outbox, Transport
from deniable.client.mqtt import MqttTransport
from deniable.core.plumbing import mqtt
from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.shuffler.mqtt import MqttIngressConfig
from deniable.sim import render
from deniable.sim.local import LocalServices, local_services
from deniable.sim.populations import exact_population
from deniable.sim.render import answer_json, answer_table, plot_answers, privacy_line
from deniable.v1 import deniable_pb2 as pb

Hold = Callable[[LocalServices], Awaitable[None]]
"""Runs once the demo's campaigns are counted, while the services still run (``demo --console``)."""

LANGUAGES = ("English", "Spanish", "German", "French", "Japanese", "Portuguese", "Hindi", "Swahili")
LANGUAGE_SHARES = (0.31, 0.20, 0.14, 0.11, 0.09, 0.07, 0.05, 0.03)
DARK_MODE_SHARE = 0.37


@dataclass
class DemoCampaign:
    """One demo question, its true answers, and what the aggregator said."""

    request: pb.CreateCampaignRequest
    truth_values: np.ndarray
    answer: pb.QueryResponse | None = None
    created: pb.Campaign | None = None  # as the aggregator stored it (planned epsilon0 and mechanism)
    acknowledged: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    signing_key: bytes = b""  # the aggregator's signing key the devices pinned and verified against

    @property
    def true_counts(self) -> list[int]:
        """True number of devices per bucket."""
        cells = max(len(self.request.labels), 2)
        return [int(count) for count in np.bincount(self.truth_values, minlength=cells)]


def demo_campaigns(
    devices: int,
    epsilon0: float,
    mechanism: str | None,
    n_min: int,
    target_epsilon: float | None = None,
    delta: float = 1e-6,
) -> list[DemoCampaign]:
    """The two demo questions with known true distributions.

    ``mechanism`` is the histogram's randomiser (a binary-only one is the binary question's
    instead). With ``target_epsilon`` the aggregator plans epsilon0 for n = ``devices`` (and the
    mechanism where none is given), and every device is shuffled in one batch.
    """
    binary_mechanism, histogram_mechanism, chosen_params = _demo_mechanisms(
        mechanism, epsilon0, devices, delta, planned=target_epsilon is not None
    )
    binary = pb.CreateCampaignRequest(
        id="dark-mode",
        question="Is dark mode on?",
        kind=pb.BINARY,
        mechanism=binary_mechanism,
        epsilon0=epsilon0,
        delta=1e-6,
        n_min=n_min,
    )
    histogram = pb.CreateCampaignRequest(
        id="ui-language",
        question="Which of these 8 languages is the interface in?",
        kind=pb.CATEGORICAL,
        labels=list(LANGUAGES),
        mechanism=histogram_mechanism,
        epsilon0=epsilon0,
        delta=1e-6,
        n_min=n_min,
    )
    for request in (binary, histogram):
        _plan_for_one_batch(request, devices, delta, mechanism, chosen_params, target_epsilon)
    return [
        DemoCampaign(binary, exact_population((1 - DARK_MODE_SHARE, DARK_MODE_SHARE), devices)),
        DemoCampaign(histogram, exact_population(LANGUAGE_SHARES, devices)),
    ]


def _demo_mechanisms(
    mechanism: str | None, epsilon0: float, devices: int, delta: float, planned: bool
) -> tuple[pb.Mechanism.ValueType, pb.Mechanism.ValueType, dict[str, float]]:
    """(binary mechanism, histogram mechanism, calibration): ``mechanism`` on the question it fits."""
    binary_mechanism: pb.Mechanism.ValueType = pb.MECHANISM_UNSPECIFIED if planned else pb.BINARY_RR
    histogram_mechanism: pb.Mechanism.ValueType = pb.MECHANISM_UNSPECIFIED if planned else pb.GRR
    if not mechanism:
        return binary_mechanism, histogram_mechanism, {}
    from deniable.core.accounting.planner import applicable

    chosen = pb.Mechanism.Value(mechanism.upper())
    params = _calibration_params(mechanism, devices, delta)
    reason = applicable(mechanism, len(LANGUAGES), params, epsilon0)
    if reason is None:
        return binary_mechanism, chosen, params
    if applicable(mechanism, 2, params, epsilon0) is None:
        return chosen, histogram_mechanism, params
    raise ValueError(f"mechanism {mechanism!r} fits neither question of the demo: {reason}")


def _plan_for_one_batch(
    request: pb.CreateCampaignRequest,
    devices: int,
    delta: float,
    mechanism: str | None,
    params: dict[str, float],
    target_epsilon: float | None,
) -> None:
    """Every device in one shuffle: the batch target, the chosen mechanism's calibration, the target ε."""
    request.delta = delta
    request.batch_target = devices  # the guarantee is planned for every device in one shuffle
    if mechanism and request.mechanism == pb.Mechanism.Value(mechanism.upper()):
        request.params.update(params)
        if "expected_n" in params:  # shuffle-only: its guarantee is planned for one batch of all
            domain = len(request.labels) or 2  # a binary request carries no labels
            request.n_min = _one_batch_n_min(mechanism, domain, devices, params)
    if target_epsilon is not None:
        request.epsilon0 = 0.0
        request.target_epsilon = target_epsilon
        request.expected_n = devices
        request.n_min = _planned_n_min(request, devices, delta, target_epsilon)


def _planned_n_min(request: pb.CreateCampaignRequest, devices: int, delta: float, target: float) -> int:
    """n_min for a planned campaign: ``devices``, or fewer where the planner's pick (the same plan the
    aggregator makes) sends a varying number of messages (``_one_batch_n_min``)."""
    from deniable.core.accounting import planner

    domain = len(request.labels) or 2
    plan = planner.plan(target, delta, devices, domain, params=dict(request.params) or None)
    return _one_batch_n_min(plan.mechanism, domain, devices, plan.params)


def _one_batch_n_min(mechanism: str, domain: int, devices: int, params: dict[str, float]) -> int:
    """Devices per batch such that all ``devices`` (almost surely) reach the message threshold.

    The aggregator turns n_min devices into the messages that many devices' worth needs
    (``message_threshold``); where the count varies, the demo's devices send their mean on
    average, so n_min is the most devices whose threshold lies 8 standard deviations below the
    mean total (one device's count: ``message_count_moments`` where the protocol states it, else
    variance at most d / 4, Bernoulli noise per bucket).
    """
    from deniable.core import mechanisms

    randomiser = mechanisms.create(mechanism, epsilon0=1.0, domain_size=domain, **params)
    if randomiser.messages_per_device is not None:
        return devices
    moments = getattr(randomiser, "message_count_moments", None)
    if moments is not None:
        mean, variance = moments()
    else:
        mean, variance = float(getattr(randomiser, "expected_messages", 1.0)), domain / 4
    low = devices * mean - 8 * math.sqrt(devices * variance)
    return max(1, min(devices, randomiser.devices_within(math.floor(low))))


def _calibration_params(mechanism: str, devices: int, delta: float) -> dict[str, float]:
    """Shuffle protocols calibrate their noise to the expected n and delta: give them the demo's."""
    import inspect

    from deniable.core import mechanisms

    accepted = inspect.signature(mechanisms.mechanism_class(mechanism)).parameters
    wanted = {"expected_n": float(devices), "delta": delta}
    return {key: value for key, value in wanted.items() if key in accepted}


async def run_pipeline(
    devices: int,
    epsilon0: float,
    workdir: Path,
    mechanism: str | None = None,
    progress: bool = True,
    target_epsilon: float | None = None,
    delta: float = 1e-6,
    mqtt_broker: BrokerAddress | None = None,
    mqtt_prefix: str = mqtt.DEFAULT_PREFIX,
    mqtt_insecure: bool = False,
    hold: Hold | None = None,
    say: Callable[[str], None] | None = None,
) -> list[DemoCampaign]:
    """Run the demo in ``workdir`` and return each campaign with its answer.

    ``say`` gets the notes worth telling before a long run (``heavy_note``); the demo prints them.

    With ``mqtt_broker`` the shuffler also serves that broker and the devices reach it there
    (campaigns from its retained topics, reports and answers as MQTT messages), not over gRPC;
    devices verify the broker's certificate (``mqtt_broker.tls``) unless ``mqtt_insecure``. With
    ``hold`` the shuffler also serves an operator port and ``hold`` runs before the services stop.
    """
    n_min = max(1, min(1000, devices))
    campaigns = demo_campaigns(devices, epsilon0, mechanism, n_min, target_epsilon, delta)
    ingress = None if mqtt_broker is None else MqttIngressConfig(broker=mqtt_broker, prefix=mqtt_prefix)
    operator_port: dict[str, Any] = {} if hold is None else {"operator_listen": "127.0.0.1:0"}
    async with local_services(workdir, ingress, **operator_port) as services:
        for campaign in campaigns:  # planning takes a few seconds
            campaign.created = await services.create_campaign(campaign.request)
            note = heavy_note(campaign.created, devices)
            if note and say is not None:
                say(note)
        transport = await _device_transport(services, mqtt_broker, mqtt_prefix, mqtt_insecure)
        outbox = Outbox(workdir / "devices" / "outbox.db")
        try:
            for campaign in campaigns:
                values = campaign.truth_values.tolist()
                reported = await services.report(campaign.request.id, values, transport, outbox, progress)
                campaign.signing_key = reported.signing_key
                campaign.acknowledged = reported.acknowledged
                campaign.timings.update(randomise_seal_s=reported.randomise_seal_s, send_s=reported.send_s)
        finally:
            outbox.close()
            await transport.close()
        started = time.perf_counter()
        for campaign in campaigns:  # the window closes: the shuffler releases what it holds
            await services.close(campaign.request.id)
        for campaign in campaigns:
            campaign.answer = await services.wait_counted(campaign.request.id, progress)
            campaign.timings["flush_count_s"] = time.perf_counter() - started
        if hold is not None:
            await hold(services)
    return campaigns


def heavy_note(created: pb.Campaign, devices: int) -> str | None:
    """What the demo says before it starts a protocol over the planner's per-device budget.

    Such a protocol (``multi_message_histogram``: 2d + 1 messages per device) multiplies the
    demo's work by its messages per device; the note says so and what it means in time, so the
    demo does not look hung (progress bars show each step as it goes).
    """
    from deniable.core.accounting.planner import DeviceBudget, device_cost
    from deniable.core.campaigns import randomiser_for

    cost = device_cost(randomiser_for(created))
    budget = DeviceBudget()
    if cost["messages_per_device"] <= budget.max_messages and cost["bytes_per_device"] <= budget.max_bytes:
        return None
    messages = cost["messages_per_device"] * devices
    return (
        f"note: {pb.Mechanism.Name(created.mechanism).lower()} is a heavy protocol here:"
        f" {cost['messages_per_device']:,.0f} messages ({cost['bytes_per_device'] / 1024:,.1f} KiB sealed)"
        f" per device, {messages:,.0f} messages for {devices:,} devices, over the planner's budget of"
        f" {budget.max_messages:.0f} messages and {budget.max_bytes / 1024:.0f} KiB; expect minutes, not"
        " seconds, on a small machine (docs/performance.md); `deniable privacy plan` lists lighter"
        " candidates"
    )


async def _device_transport(
    services: LocalServices, broker: BrokerAddress | None, prefix: str, insecure: bool
) -> Transport:
    """gRPC to the shuffler, or (with a broker) MQTT once the shuffler has announced its campaigns there."""
    if broker is None:
        return services.device_transport()
    assert services.shuffler.mqtt is not None
    await asyncio.wait_for(services.shuffler.mqtt.connected.wait(), 30)
    await services.shuffler.mqtt.announce_now()  # do not wait for the periodic announcement
    return MqttTransport(broker, prefix=prefix, insecure=insecure)


def demo_report(campaigns: Sequence[DemoCampaign]) -> dict[str, Any]:
    """The ``--json`` document."""
    out = []
    for campaign in campaigns:
        assert campaign.answer is not None
        entry = answer_json(campaign.answer, campaign.true_counts)
        entry["kind"] = "binary" if campaign.request.kind == pb.BINARY else "histogram"
        entry["question"] = campaign.request.question
        entry["acknowledged"] = campaign.acknowledged
        entry["timings_s"] = campaign.timings
        entry.update(error_comparison(campaign))
        out.append(entry)
    return {"campaigns": out}


def error_comparison(campaign: DemoCampaign) -> dict[str, Any]:
    """Observed error of the shuffled protocol beside central Laplace's expected error, same (ε, δ).

    The Laplace figure is computed from its variance (replace-one neighbours, as the shuffle
    analyses), never by running it on the raw data. ``planned`` is set for planned campaigns.
    """
    from deniable.core.accounting.planner import central_laplace, expected_bias
    from deniable.core.campaigns import randomiser_for

    answer, created = campaign.answer, campaign.created
    assert answer is not None and created is not None
    truth = np.asarray(campaign.true_counts, dtype=np.float64)
    estimates = np.asarray([b.estimate for b in answer.buckets], dtype=np.float64)
    observed = float(np.sqrt(np.mean((estimates - truth) ** 2)))
    randomiser = randomiser_for(created)
    mse = np.asarray(randomiser.variance(truth, int(answer.n)), dtype=np.float64)
    bias = expected_bias(randomiser, truth, int(answer.n))  # thresholding estimators are biased
    expected = float(np.sqrt(np.mean(mse if bias is None else mse + bias * bias)))  # at this truth
    epsilon = answer.privacy.central_epsilon
    delta = answer.privacy.delta or created.delta
    out: dict[str, Any] = {
        "observed_rmse": observed,
        "expected_std_error": expected,
        "central_laplace_std_error": None,
        "central_laplace": None,
        "error_ratio": None,
        "expected_error_ratio": None,
        "planned": None,
        "plan_at_target": plan_at_target(created, int(answer.privacy.batch_target), epsilon),
    }
    if math.isfinite(epsilon) and epsilon > 0:
        laplace = central_laplace(epsilon, delta, len(created.labels))
        out.update(
            central_laplace_std_error=laplace.std_error,
            central_laplace={"epsilon": epsilon, "delta": delta, "sensitivity": laplace.sensitivity},
            error_ratio=observed / laplace.std_error,
            expected_error_ratio=expected / laplace.std_error,
        )
    if created.target_epsilon:
        bound = randomiser.central_guarantee(int(created.expected_n), created.delta)
        out["planned"] = {
            "target_epsilon": created.target_epsilon,
            "delta": created.delta,
            "expected_n": int(created.expected_n),
            "mechanism": pb.Mechanism.Name(created.mechanism).lower(),
            "epsilon0": created.epsilon0,
            "params": dict(created.params),
            "central_epsilon": bound.epsilon,
            "analysis": bound.analysis,
        }
    return out


def plan_at_target(created: pb.Campaign, target: int, stated: float) -> dict[str, Any]:
    """The central ε the campaign's mechanism gives at its batch target (the plan), beside the stated one."""
    from deniable.core.campaigns import randomiser_for

    if target <= 0:
        return {"batch_target": target, "central_epsilon": None, "reason": "no batch target", "kept": None}
    bound = randomiser_for(created).central_guarantee(target, created.delta)
    planned = bound.epsilon if math.isfinite(bound.epsilon) else None
    kept = None if planned is None or not math.isfinite(stated) else stated <= planned * (1 + 1e-9)
    return {
        "batch_target": target,
        "central_epsilon": planned,
        "analysis": bound.analysis,
        "reason": None if planned is not None else (bound.note or "no finite epsilon at the target"),
        "kept": kept,
    }


def run_demo(
    devices: int = 20_000,
    epsilon0: float = 2.0,
    json_path: Path | None = None,
    plot_path: Path | None = None,
    mechanism: str | None = None,
    workdir: Path | None = None,
    progress: bool = True,
    target_epsilon: float | None = None,
    delta: float = 1e-6,
    mqtt_broker: BrokerAddress | None = None,
    mqtt_prefix: str = mqtt.DEFAULT_PREFIX,
    mqtt_insecure: bool = False,
    hold: Hold | None = None,
) -> dict[str, Any]:
    """Run the demo, print the tables and the privacy statements, write JSON and plot if asked.

    ``hold`` (``demo --console``) runs after counting while the services still run; the tables
    print once it returns."""
    if devices < 1:
        raise ValueError("--devices must be at least 1")
    if not 0 < delta < 1:
        raise ValueError("--delta must lie in (0, 1)")
    started = time.perf_counter()
    print(tls_line(mqtt_broker, mqtt_insecure))
    with tempfile.TemporaryDirectory(prefix="deniable-demo-") as tmp:
        pipeline = run_pipeline(
            devices,
            epsilon0,
            workdir or Path(tmp),
            mechanism,
            progress,
            target_epsilon,
            delta,
            mqtt_broker,
            mqtt_prefix,
            mqtt_insecure,
            hold,
            say=lambda note: print(note, flush=True),
        )
        campaigns = asyncio.run(pipeline)
    elapsed = time.perf_counter() - started
    report = demo_report(campaigns)
    report.update(
        devices=devices,
        elapsed_s=elapsed,
        target_epsilon=target_epsilon,
        signing_public_key=campaigns[0].signing_key.hex() if campaigns else "",
    )
    print(answers_text(campaigns, devices, elapsed))
    print(comparison_text(report["campaigns"], target_epsilon))
    render.write_json(report, json_path)
    if plot_path is not None:
        plot_answers(
            [(c.request.question, c.answer, c.true_counts) for c in campaigns if c.answer is not None],
            plot_path,
        )
        print(f"wrote {plot_path}")
    return report


def tls_line(mqtt_broker: BrokerAddress | None, mqtt_insecure: bool) -> str:
    """What the demo says first: which links are encrypted and who verifies whom."""
    return (
        "TLS on every link with throwaway certificates, one fresh development CA per party: devices"
        " accept only\nthe shuffler's certificate, the shuffler only the aggregator's; the shuffler and"
        " the aggregator's operator\nauthenticate to the aggregator with client certificates"
        + (
            ""
            if mqtt_broker is None
            else "; devices reach the MQTT broker in PLAINTEXT (--mqtt-insecure)"
            if mqtt_insecure
            else "; devices verify the MQTT broker's certificate"
        )
    )


def answers_text(campaigns: Sequence[DemoCampaign], devices: int, elapsed: float) -> str:
    """Each campaign's table and privacy statement, the signing note, and how many counts lie in their CI."""
    lines: list[str] = []
    inside = total = 0
    for campaign in campaigns:
        answer = campaign.answer
        assert answer is not None
        counted = f"n = {answer.n}"
        if answer.messages != answer.n:
            counted += f" ({answer.messages} messages)"
        lines += [
            f"\n{campaign.request.question}  [{campaign.request.id}, {report_mechanism(answer)}]",
            answer_table(answer, campaign.true_counts),
            f"{counted} counted of {campaign.acknowledged} messages acknowledged; {answer.rejected} rejected",
            "privacy: " + privacy_line(answer.privacy),
        ]
        for bucket, truth in zip(answer.buckets, campaign.true_counts, strict=True):
            total += 1
            inside += int(bucket.ci_low <= truth <= bucket.ci_high)
    if campaigns and all(c.signing_key for c in campaigns):
        lines.append(
            f"\ncampaigns signed: every device verified its campaign description against the pinned"
            f" aggregator signing key (Ed25519 {campaigns[0].signing_key.hex()[:16]}…) before sealing"
        )
    lines.append(
        f"\n{inside} of {total} true counts lie inside their 95% CI (* marks the others);"
        f" {devices} devices in {elapsed:.1f} s"
    )
    return "\n".join(lines)


def report_mechanism(answer: pb.QueryResponse) -> str:
    """Mechanism name for the table heading."""
    return pb.Mechanism.Name(answer.mechanism).lower()


def _number(value: float | None, spec: str, suffix: str = "") -> str:
    """A table cell: the formatted number, or "n/a" where there is none (e.g. ε not finite)."""
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def comparison_text(entries: Sequence[dict[str, Any]], target_epsilon: float | None) -> str:
    """The plan (if any), the stated ε against the plan at the batch target, and the error table
    against central Laplace at the same (ε, δ)."""
    lines = []
    if target_epsilon is not None:
        lines.append(f"\nplanned by the aggregator for the target central ε = {target_epsilon:g}:")
        for e in entries:
            p = e["planned"]
            params = "".join(f", {k} = {v:g}" for k, v in sorted(p["params"].items()))
            lines.append(
                f"  {e['id']:12} {p['mechanism']:18} ε0 = {p['epsilon0']:.4f}{params} → central"
                f" (ε, δ) = ({p['central_epsilon']:.4f}, {p['delta']:g}) at n = {p['expected_n']}"
                f" ({p['analysis']})"
            )
    lines.append("\nstated central ε against the plan at the batch target (smallest batch / batches):")
    for e in entries:
        plan = e["plan_at_target"]
        stated = _number(e["central_epsilon"], ".4f")
        planned = _number(plan["central_epsilon"], ".4f")
        verdict = {True: "kept", False: "NOT kept", None: "n/a"}[plan["kept"]]
        why = f" ({e['central_epsilon_unavailable']})" if e["central_epsilon_unavailable"] else ""
        lines.append(
            f"  {e['id']:12} stated {stated} at {e['smallest_batch']} devices / {e['batches']} batch(es);"
            f" planned {planned} at {plan['batch_target']}: {verdict}{why}"
        )
    lines.append(
        "\nerror per count: the shuffled protocol (observed RMSE over buckets on this data, and its"
        " expected\nRMSE at this truth) beside central Laplace at the same (ε, δ) (expected std"
        " error from its\nvariance, replace-one neighbours; not run on the raw data by a trusted party)"
    )
    lines.append(
        f"  {'campaign':12} {'mechanism':18} {'central ε':>9} {'observed':>9} {'expected':>9}"
        f" {'Laplace':>8} {'observed/Laplace':>16} {'expected/Laplace':>16}"
    )
    for e in entries:
        ratio = _number(e["error_ratio"], "15.1f", "×")
        expected_ratio = _number(e["expected_error_ratio"], "15.1f", "×")
        lines.append(
            f"  {e['id']:12} {e['mechanism']:18} {_number(e['central_epsilon'], '9.4f'):>9}"
            f" {e['observed_rmse']:9.2f} {e['expected_std_error']:9.2f}"
            f" {_number(e['central_laplace_std_error'], '8.3f'):>8} {ratio:>16} {expected_ratio:>16}"
        )
    return "\n".join(lines)
