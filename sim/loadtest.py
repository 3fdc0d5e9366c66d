"""``deniable loadtest``: a population of simulated devices through the real services.

Devices (default 100,000) answer one categorical campaign with a known, deterministic truth.
Their reports are randomised and sealed first, on every core (as the devices would have done on
their own hardware); then they arrive over ``duration`` seconds following a pattern:

- ``constant``: a Poisson process at the mean rate;
- ``bursts``: 15% of the time at 8x the base rate (every sixth of the run), quiet otherwise;
- ``diurnal``: one compressed day, rate 1 - 0.8 cos(2 pi t / T): slow at the ends, peaking midway.

Arrival times are the order statistics of CSPRNG uniforms mapped through the pattern's inverse
cumulative rate (no ``random``/``numpy.random``). Reports due in the same tick (50 ms) are sent
together, up to ``request_reports`` per SubmitReports call (a gateway's batch), with at most
``concurrency`` calls in flight; each call has a deadline and at most 3 attempts, and the whole
run a time limit: every loop is bounded in count and time. Only loopback addresses are allowed.

At the end the shuffler is flushed (as an operator or the campaign's window would), and the run
waits for the aggregator to count every acknowledged report. It prints throughput over time,
acknowledgement latency percentiles, rejections and the accuracy of the answers against the
truth, and writes PNG plots (throughput, latency, estimates with CIs) and optionally JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from deniable.sim import benchkit, populations, render
from deniable.sim.benchkit import ServiceProcess
from deniable.sim.submitters import TRANSPORTS, Submit, SubmitFailed, open_grpc, open_h2, open_http
from deniable.v1 import deniable_pb2 as pb

PATTERNS: Final = ("constant", "bursts", "diurnal")
DEFAULT_DEVICES: Final = 100_000
DEFAULT_DURATION_S: Final = 60.0
BURST_FACTOR: Final = 8.0
BURST_SHARE: Final = 0.15
BURSTS: Final = 6
ATTEMPTS: Final = 3
FloatArray = npt.NDArray[np.float64]


@dataclass
class LoadConfig:
    """One load test."""

    devices: int = DEFAULT_DEVICES
    pattern: str = "constant"
    duration_s: float = DEFAULT_DURATION_S
    shuffler: str | None = None
    aggregator: str | None = None
    buckets: int = 8
    epsilon0: float = 1.0
    mechanism: str = "grr"
    request_reports: int = benchkit.REQUEST_REPORTS
    concurrency: int = 8
    tick_s: float = 0.05
    workers: int = field(default_factory=benchkit.cores)
    out_dir: Path = Path("loadtest-results")
    json_path: Path | None = None
    workdir: Path | None = None
    progress: bool = True
    grace_s: float | None = None
    """Time allowed beyond ``duration_s`` for sending and counting (default: max(60 s, duration))."""
    transport: str = "grpc"
    """How devices reach the shuffler: ``grpc``, ``https`` (its HTTPS face, TLS, HTTP/1.1), ``h2``
    (the same over HTTP/2) or ``http`` (that face in plaintext, like the benchmark's gRPC); only
    with services started here."""

    @property
    def rate(self) -> float:
        """Mean arrivals per second."""
        return self.devices / self.duration_s

    def check(self) -> None:
        """ValueError for settings that cannot run."""
        if self.pattern not in PATTERNS:
            raise ValueError(f"--pattern must be one of {', '.join(PATTERNS)}, got {self.pattern!r}")
        if self.devices < 1 or not (self.duration_s > 0 and math.isfinite(self.duration_s)):
            raise ValueError("--devices must be >= 1 and --duration a positive number of seconds")
        if self.buckets < 2:
            raise ValueError("--buckets must be at least 2")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"--transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        if self.transport != "grpc" and self.shuffler is not None:
            raise ValueError("--transport https/h2/http starts its own services: not with --shuffler")
        if (self.shuffler is None) != (self.aggregator is None):
            raise ValueError("give both --shuffler and --aggregator (a deployment), or neither")
        for address in (self.shuffler, self.aggregator):
            if address is not None:
                benchkit.check_loopback(address)


def resolve_timing(devices: int | None, rate: float | None, duration: float | None) -> tuple[int, float]:
    """(devices, duration) from any two of devices, rate and duration (defaults fill the rest)."""
    if devices is not None and rate is not None and duration is not None:
        raise ValueError("give at most two of --devices, --rate and --duration")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise ValueError("--rate must be a positive number of reports per second")
    if rate is not None and duration is not None:
        return max(1, round(rate * duration)), duration
    devices = DEFAULT_DEVICES if devices is None else devices
    if duration is None:
        duration = devices / rate if rate is not None else DEFAULT_DURATION_S
    return devices, duration


# --- arrivals -------------------------------------------------------------------------------------


def intensity(pattern: str, t: FloatArray, duration: float) -> FloatArray:
    """Relative arrival rate at times ``t`` (any scale; only its shape matters)."""
    if pattern == "constant":
        return np.ones_like(t)
    if pattern == "bursts":
        period = duration / BURSTS
        in_burst = np.mod(t, period) < BURST_SHARE * period
        return np.where(in_burst, BURST_FACTOR, 1.0)
    if pattern == "diurnal":
        return 1.0 - 0.8 * np.cos(2 * np.pi * t / duration)
    raise ValueError(f"unknown pattern {pattern!r}")


def arrival_times(pattern: str, devices: int, duration: float) -> FloatArray:
    """Sorted arrival times in [0, duration): an inhomogeneous Poisson process given its count.

    Given n arrivals, their times are n independent draws from the normalised rate; drawn by
    inverting the cumulative rate at sorted CSPRNG uniforms.
    """
    from deniable.core.rng import default_rng

    uniforms = np.sort((default_rng().uint64_array(devices) >> np.uint64(11)).astype(np.float64) * 2.0**-53)
    grid = np.linspace(0.0, duration, 20_001)
    rate = intensity(pattern, grid, duration)
    cumulative = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2 * np.diff(grid))])
    cumulative /= cumulative[-1]
    return np.minimum(np.interp(uniforms, cumulative, grid), np.nextafter(duration, 0.0))


# --- the run --------------------------------------------------------------------------------------


@dataclass
class Tracker:
    """What happened to every report: when it was acknowledged, and what was refused."""

    arrivals: FloatArray
    acked_at: FloatArray = field(init=False)
    rejections: Counter[str] = field(default_factory=Counter)
    failed_reports: int = 0
    failed_requests: int = 0
    attempts: int = 0
    acknowledged: int = 0
    counted_series: list[tuple[float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.acked_at = np.full(self.arrivals.size, np.nan)

    def record(self, response: pb.SubmitReportsResponse, first: int, last: int, now: float) -> None:
        """Reports [first, last) answered at ``now``: the refused ones by reason, the rest acknowledged."""
        refused = {r.index for r in response.rejected}
        for rejection in response.rejected:
            self.rejections[pb.RejectReason.Name(rejection.reason)] += 1
        acked = np.ones(last - first, dtype=bool)
        if refused:
            acked[[i for i in refused if i < last - first]] = False
        self.acked_at[first:last][acked] = now
        self.acknowledged += int(response.accepted)

    def fail(self, reports: int) -> None:
        """A request given up on (deadline passed, or not retryable)."""
        self.failed_requests += 1
        self.failed_reports += reports


async def _submit_range(
    submit: Submit,
    elements: list[bytes],
    span: tuple[int, int],
    tracker: Tracker,
    deadline: float,
    started: float,
) -> bool:
    """One request of reports [first, last): at most ``ATTEMPTS`` tries, each before the deadline."""
    first, last = span
    raw = b"".join(elements[first:last])
    for attempt in range(ATTEMPTS):
        tracker.attempts += 1
        remaining = deadline - time.perf_counter()
        if remaining <= 0:
            break
        try:
            response = await submit(raw, min(30.0, remaining))
        except SubmitFailed as exc:
            if exc.retryable and attempt + 1 < ATTEMPTS:
                await asyncio.sleep(0.05 * 2**attempt)
                continue
            break
        tracker.record(response, first, last, time.perf_counter() - started)
        return True
    tracker.fail(last - first)
    return False


async def _enqueue_due(
    config: LoadConfig,
    arrivals: FloatArray,
    queue: asyncio.Queue[Any],
    started: float,
    deadline: float,
    bar: Any,
) -> int:
    """Each tick, queue the reports now due, ``request_reports`` a request; returns how many were queued."""
    sent = 0
    while sent < arrivals.size and time.perf_counter() < deadline:
        due = int(np.searchsorted(arrivals, time.perf_counter() - started, side="right"))
        while sent < due:
            last = min(due, sent + config.request_reports)
            queue.put_nowait((sent, last))
            sent = last
        bar.set_postfix(queued=queue.qsize(), refresh=False)
        await asyncio.sleep(config.tick_s)
    return sent


def _submitter(
    config: LoadConfig, where: Deployment, campaign_id: str
) -> contextlib.AbstractAsyncContextManager[Submit]:
    """The shuffler's device port (gRPC) or its HTTPS face, as ``config.transport`` says."""
    if config.transport == "grpc":
        return open_grpc(where.shuffler)
    if where.https is None:
        raise RuntimeError("the shuffler was started without its HTTPS face")
    scheme = "https" if where.ca is not None else "http"
    if config.transport == "h2" and where.ca is not None:
        return open_h2(f"https://{where.https}", campaign_id, config.concurrency, where.ca)
    return open_http(f"{scheme}://{where.https}", campaign_id, config.concurrency, where.ca)


async def _drive(
    config: LoadConfig, submit: Submit, elements: list[bytes], tracker: Tracker, deadline: float, bar: Any
) -> None:
    """Send reports as they become due; returns when all are answered or the deadline passes."""
    queue: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
    started = time.perf_counter()

    async def sender() -> None:
        while (span := await queue.get()) is not None:
            if await _submit_range(submit, elements, span, tracker, deadline, started):
                bar.update(span[1] - span[0])

    senders = [asyncio.create_task(sender()) for _ in range(max(1, config.concurrency))]
    try:
        sent = await _enqueue_due(config, tracker.arrivals, queue, started, deadline, bar)
        for _ in senders:
            queue.put_nowait(None)
        done, pending = await asyncio.wait(senders, timeout=max(0.0, deadline - time.perf_counter()))
        for task in pending:
            task.cancel()
        for task in done:
            task.result()
        tracker.failed_reports += tracker.arrivals.size - sent  # never queued: the deadline came first
    finally:
        for task in senders:
            task.cancel()


async def _watch_counted(metrics_port: int, tracker: Tracker, started: float, stop: asyncio.Event) -> None:
    """Sample the aggregator's counted total every half second (cheap Prometheus scrape)."""
    baseline = await asyncio.to_thread(benchkit.scrape_counted, metrics_port)
    while not stop.is_set():
        try:
            counted = await asyncio.to_thread(benchkit.scrape_counted, metrics_port)
        except OSError:
            counted = -1
        if counted >= 0:
            tracker.counted_series.append((time.perf_counter() - started, counted - baseline))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.5)
    with contextlib.suppress(OSError):  # the last word: everything counted by now
        counted = await asyncio.to_thread(benchkit.scrape_counted, metrics_port)
        tracker.counted_series.append((time.perf_counter() - started, counted - baseline))


def _campaign_request(config: LoadConfig) -> pb.CreateCampaignRequest:
    """The load test's categorical campaign, released in batches of 50,000 (the rest at the end)."""
    from deniable.core import mechanisms
    from deniable.core.rng import default_rng

    return benchkit.bucket_campaign_request(
        f"loadtest-{default_rng().bytes(4).hex()}",
        config.buckets,
        config.epsilon0,
        min(1000, config.devices),
        "load test",
        mechanism=mechanisms.proto_for_name(config.mechanism),
        batch_target=min(50_000, config.devices),
    )


@dataclass
class Deployment:
    """Where the load goes: services started here (``services``), or a running deployment's addresses."""

    shuffler: str
    aggregator: str
    services: list[ServiceProcess] = field(default_factory=list)
    metrics_port: int | None = None
    https: str | None = None
    """The shuffler's HTTPS face (``host:port``) when the transport is https or http."""
    ca: Path | None = None
    """The CA of that face's certificate (https), None for plaintext (http)."""


async def _deployment(config: LoadConfig, workdir: Path, services: list[ServiceProcess]) -> Deployment:
    """The deployment named in ``config``, or an aggregator and a shuffler started here (in ``services``)."""
    if config.shuffler is not None and config.aggregator is not None:
        return Deployment(config.shuffler, config.aggregator)
    aggregator = benchkit.aggregator_process(workdir / "aggregator", config.workers)
    services.append(aggregator)
    await asyncio.to_thread(aggregator.start)
    https, ca = _https_face(config, workdir)
    shuffler = benchkit.shuffler_process(workdir / "shuffler", aggregator.address, **https)
    services.append(shuffler)
    await asyncio.to_thread(shuffler.start)
    where = Deployment(shuffler.address, aggregator.address, services, aggregator.metrics_port)
    where.https, where.ca = shuffler.https_address, ca
    return where


def _https_face(config: LoadConfig, workdir: Path) -> tuple[dict[str, Any], Path | None]:
    """Shuffler settings for its HTTPS face (TLS with development certificates for ``https``) and
    the CA to trust; nothing for gRPC."""
    if config.transport == "grpc":
        return {}, None
    from deniable.shuffler.https import HttpsConfig

    if config.transport == "http":
        return {"https": HttpsConfig(listen="127.0.0.1:0", max_concurrent=1024)}, None
    from deniable.core.plumbing.certs import write_dev_certs

    certs = write_dev_certs(workdir / "certs", roles=("shuffler",))
    tls = certs.server_tls("shuffler")
    return {"https": HttpsConfig(listen="127.0.0.1:0", max_concurrent=1024, tls=tls)}, certs.ca("shuffler")


async def _seal_devices(
    config: LoadConfig, campaign: pb.Campaign, values: npt.NDArray[np.int64]
) -> list[bytes]:
    """Every device's report sealed on every core, as SubmitReports elements (one message per device)."""
    pool = await asyncio.to_thread(benchkit.start_pool, config.workers)
    try:
        sealed = await asyncio.to_thread(
            benchkit.seal_with_bar, campaign, values, pool, config.workers, "seal (devices)", config.progress
        )
    finally:
        await asyncio.to_thread(pool.shutdown)
    if sealed.count != config.devices:
        raise ValueError(
            f"mechanism {config.mechanism} sends several messages per device: not supported here"
        )
    return benchkit.report_elements(campaign.id, campaign.key_id, sealed.ciphertexts, 1)


@dataclass
class Sent:
    """What sending and counting took: the final answer, and seconds from the first arrival."""

    answer: pb.QueryResponse
    send_s: float
    counted_s: float


async def _send_and_count(
    config: LoadConfig, where: Deployment, campaign: pb.Campaign, elements: list[bytes], tracker: Tracker
) -> Sent:
    """Arrivals over the run, a flush, then a wait until the aggregator counted every acknowledged report."""
    from tqdm import tqdm

    grace = config.grace_s if config.grace_s is not None else max(60.0, config.duration_s)
    started = time.perf_counter()
    deadline = started + config.duration_s + grace
    stop_watch = asyncio.Event()
    watcher = None
    if where.metrics_port is not None:
        watcher = asyncio.create_task(_watch_counted(where.metrics_port, tracker, started, stop_watch))
    try:
        desc = f"send ({config.pattern})"
        with tqdm(total=config.devices, desc=desc, unit="report", disable=not config.progress) as bar:
            async with _submitter(config, where, campaign.id) as submit:
                await _drive(config, submit, elements, tracker, deadline, bar)
        sent_s = time.perf_counter() - started
        await benchkit.flush_shuffler(where.shuffler, campaign.id)
        answer, reached = await benchkit.wait_counted(
            where.aggregator,
            campaign.id,
            tracker.acknowledged,
            timeout_s=max(5.0, deadline - time.perf_counter()),
        )
    finally:
        stop_watch.set()
        if watcher is not None:
            await watcher
    return Sent(answer, sent_s, reached - started)


async def _run(config: LoadConfig, workdir: Path) -> dict[str, Any]:
    """Deploy (or reach) the services, seal every device's report, send them as they arrive, summarise."""
    services: list[ServiceProcess] = []
    try:
        where = await _deployment(config, workdir, services)
        campaign = await benchkit.create_campaign(where.aggregator, _campaign_request(config))
        values = populations.interleaved_population(populations.zipf_shares(config.buckets), config.devices)
        truth = np.bincount(values, minlength=config.buckets).astype(np.int64)
        elements = await _seal_devices(config, campaign, values)
        tracker = Tracker(arrival_times(config.pattern, config.devices, config.duration_s))
        cpu_before = [service.cpu_seconds() for service in services]
        sent = await _send_and_count(config, where, campaign, elements, tracker)
        service_cpu = {
            service.kind: service.cpu_seconds() - before
            for service, before in zip(services, cpu_before, strict=True)
        }
    finally:
        for service in reversed(services):
            await asyncio.to_thread(service.stop)
    result = summarise(config, campaign, tracker, sent.answer, truth, sent.send_s, sent.counted_s)
    result["service_cpu_s"] = service_cpu
    if service_cpu and tracker.acknowledged:
        result["service_cpu_us_per_report"] = {
            kind: seconds / tracker.acknowledged * 1e6 for kind, seconds in service_cpu.items()
        }
    return result


# --- results --------------------------------------------------------------------------------------


def bin_width(horizon: float) -> float:
    """Seconds per throughput bin: 1 s, finer for short runs (so bursts stay visible)."""
    return next((w for w in (0.05, 0.1, 0.2, 0.25, 0.5) if w >= horizon / 20), 1.0)


def _rates(times: FloatArray, horizon: float) -> list[float]:
    """Reports per second in consecutive bins of ``bin_width(horizon)`` seconds."""
    width = bin_width(horizon)
    bins = max(1, math.ceil(horizon / width))
    counts, _ = np.histogram(times[np.isfinite(times)], bins=bins, range=(0.0, bins * width))
    return [float(c) / width for c in counts]


def latency_percentiles(latency_ms: FloatArray) -> dict[str, float]:
    """p50, p90, p99 and max acknowledgement latency ({} when nothing was acknowledged)."""
    if not latency_ms.size:
        return {}
    return {f"p{q}": float(np.percentile(latency_ms, q)) for q in (50, 90, 99)} | {
        "max": float(latency_ms.max())
    }


def accuracy(answer: pb.QueryResponse, truth: npt.NDArray[np.int64]) -> dict[str, Any]:
    """Each bucket's estimate against its true count, and how many true counts lie inside their CI."""
    buckets = [
        {
            "label": bucket.label,
            "true_count": int(true_count),
            "estimate": bucket.estimate,
            "std_error": bucket.std_error,
            "ci_low": bucket.ci_low,
            "ci_high": bucket.ci_high,
            "inside_ci": bucket.ci_low <= true_count <= bucket.ci_high,
        }
        for bucket, true_count in zip(answer.buckets, truth.tolist(), strict=True)
    ]
    errors = np.array([b["estimate"] - b["true_count"] for b in buckets])
    standard = np.array(
        [e / b["std_error"] if b["std_error"] else 0.0 for e, b in zip(errors, buckets, strict=True)]
    )
    return {
        "buckets": buckets,
        "inside_ci": sum(int(b["inside_ci"]) for b in buckets),
        "confidence": answer.confidence,
        "max_abs_error": float(np.abs(errors).max()) if errors.size else 0.0,
        "rmse": float(np.sqrt(np.mean(errors**2))) if errors.size else 0.0,
        "max_abs_standardised_error": float(np.abs(standard).max()) if standard.size else 0.0,
    }


def summarise(
    config: LoadConfig,
    campaign: pb.Campaign,
    tracker: Tracker,
    answer: pb.QueryResponse,
    truth: npt.NDArray[np.int64],
    sent_s: float,
    counted_s: float,
) -> dict[str, Any]:
    """Everything the run measured, as a JSON-ready dict."""
    acked = np.isfinite(tracker.acked_at)
    latency_ms = (tracker.acked_at[acked] - tracker.arrivals[acked]) * 1000
    horizon = max(config.duration_s, sent_s)
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()},
        "campaign": campaign.id,
        "mean_rate_per_s": config.rate,
        "offered": int(tracker.arrivals.size),
        "acknowledged": tracker.acknowledged,
        "counted": int(answer.messages),
        "rejected_by_aggregator": int(answer.rejected),
        "all_acknowledged_counted": int(answer.messages) == tracker.acknowledged,
        "rejections_by_shuffler": dict(tracker.rejections),
        "failed_reports": tracker.failed_reports,
        "failed_requests": tracker.failed_requests,
        "requests": tracker.attempts,
        "send_s": sent_s,
        "counted_after_s": counted_s,
        "acknowledged_per_s": tracker.acknowledged / sent_s if sent_s else 0.0,
        "latency_ms": latency_percentiles(latency_ms),
        "bin_s": bin_width(horizon),
        "offered_per_second": _rates(tracker.arrivals, horizon),
        "acknowledged_per_second": _rates(tracker.acked_at, horizon),
        "counted_series": tracker.counted_series,
        "accuracy": accuracy(answer, truth),
        "privacy": {
            "epsilon0": answer.privacy.epsilon0,
            "central_epsilon": answer.privacy.central_epsilon,
            "delta": answer.privacy.delta,
            "amplified": answer.privacy.amplified,
        },
        "answer": answer.SerializeToString().hex(),
        "_latency_ms": latency_ms.tolist(),
    }


def _sparkline(series: list[float]) -> str:
    blocks = " ▁▂▃▄▅▆▇█"
    top = max(series) if series else 0
    if top <= 0:
        return ""
    step = max(1, math.ceil(len(series) / 60))
    points = [max(series[i : i + step]) for i in range(0, len(series), step)]
    return "".join(blocks[min(8, math.ceil(p / top * 8))] for p in points)


def format_summary(result: dict[str, Any]) -> str:
    """What ``deniable loadtest`` prints at the end."""
    latency = result["latency_ms"]
    accuracy = result["accuracy"]
    lines = [
        f"campaign {result['campaign']}: {result['offered']:,} devices,"
        f" pattern {result['config']['pattern']}, over {result['config'].get('transport', 'grpc')},"
        f" mean {result['mean_rate_per_s']:,.0f}/s over {result['config']['duration_s']:g} s",
        f"acknowledged {result['acknowledged']:,} in {result['send_s']:.1f} s"
        f" ({result['acknowledged_per_s']:,.0f}/s); counted {result['counted']:,}"
        f" {'= every acknowledged report' if result['all_acknowledged_counted'] else '!= acknowledged'}"
        f" after {result['counted_after_s']:.1f} s",
        f"throughput over time ({result['bin_s']:g} s bins, acknowledged/s):"
        f" {_sparkline(result['acknowledged_per_second'])}"
        f"  peak {max(result['acknowledged_per_second'], default=0):,.0f}/s",
        f"offered over time   ({result['bin_s']:g} s bins, arrivals/s):    "
        f" {_sparkline(result['offered_per_second'])}"
        f"  peak {max(result['offered_per_second'], default=0):,.0f}/s",
    ]
    if latency:
        lines.append(
            f"acknowledgement latency: p50 {latency['p50']:.1f} ms, p90 {latency['p90']:.1f} ms,"
            f" p99 {latency['p99']:.1f} ms, max {latency['max']:.1f} ms"
        )
    rejected = result["rejections_by_shuffler"]
    lines.append(
        f"rejections: shuffler {sum(rejected.values())}"
        + (f" {dict(rejected)}" if rejected else "")
        + f", aggregator {result['rejected_by_aggregator']}; failed reports {result['failed_reports']}"
        f" ({result['failed_requests']} failed requests of {result['requests']} attempts)"
    )
    lines.append(
        f"accuracy: {accuracy['inside_ci']} of {len(accuracy['buckets'])} true counts inside their"
        f" {accuracy['confidence'] * 100:g}% CI; RMSE {accuracy['rmse']:.1f},"
        f" max |error| {accuracy['max_abs_error']:.1f}"
        f" ({accuracy['max_abs_standardised_error']:.2f} std errors)"
    )
    per_report = result.get("service_cpu_us_per_report")
    if per_report:
        lines.append(
            "service CPU per report: "
            + ", ".join(f"{kind} {value:.1f} µs" for kind, value in sorted(per_report.items()))
            + f" ({result['requests']:,} requests,"
            f" ~{result['offered'] / max(1, result['requests']):.0f} reports each)"
        )
    privacy = result["privacy"]
    lines.append(
        f"privacy: ε0 = {privacy['epsilon0']:g}; central (ε, δ) = ({privacy['central_epsilon']:.3g},"
        f" {privacy['delta']:.0e}) {'after shuffling' if privacy['amplified'] else '(no amplification)'}"
    )
    return "\n".join(lines)


def _plot_throughput(result: dict[str, Any], path: Path) -> None:
    """Offered and acknowledged reports per second, and the cumulative acknowledged and counted."""
    import matplotlib.pyplot as plt

    fig, (rates, totals) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    offered, acked = result["offered_per_second"], result["acknowledged_per_second"]
    width = result["bin_s"]
    rates.step(
        np.arange(len(offered)) * width, offered, where="post", label="offered (arrivals/s)", color="#999999"
    )
    rates.step(np.arange(len(acked)) * width, acked, where="post", label="acknowledged/s", color="#2166ac")
    rates.set_ylabel("reports per second")
    rates.set_title(f"{result['offered']:,} devices, {result['config']['pattern']} arrivals")
    rates.legend(loc="upper right", fontsize=8)
    ends = np.arange(1, len(acked) + 1) * width
    totals.plot(ends, np.cumsum(acked) * width, label="acknowledged (cumulative)", color="#2166ac")
    series = result["counted_series"]
    if series:
        label = "counted by the aggregator (cumulative)"
        totals.step(
            [t for t, _ in series], [c for _, c in series], where="post", label=label, color="#b2182b"
        )
    totals.set_xlabel("seconds since the first arrival")
    totals.set_ylabel("reports")
    totals.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_latency(result: dict[str, Any], latency_ms: FloatArray, path: Path) -> None:
    """The acknowledgement latency histogram with its percentiles marked."""
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(8, 4))
    if latency_ms.size:
        axis.hist(latency_ms, bins=60, color="#4393c3")
        for name, value in result["latency_ms"].items():
            axis.axvline(value, color="#b2182b", linestyle="--", linewidth=1)
            axis.annotate(name, (value, axis.get_ylim()[1] * 0.9), rotation=90, fontsize=8)
    axis.set_xlabel("acknowledgement latency (ms, arrival to SubmitReports answer)")
    axis.set_ylabel("reports")
    axis.set_title("latency distribution")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(result: dict[str, Any], tracker_latency_ms: FloatArray, out_dir: Path) -> list[Path]:
    """throughput.png, latency.png and estimates.png in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    from deniable.sim.render import plot_answers

    out_dir.mkdir(parents=True, exist_ok=True)
    throughput, latency, estimates = (
        out_dir / name for name in ("throughput.png", "latency.png", "estimates.png")
    )
    _plot_throughput(result, throughput)
    _plot_latency(result, tracker_latency_ms, latency)
    answer = pb.QueryResponse.FromString(bytes.fromhex(result["answer"]))
    truth = [b["true_count"] for b in result["accuracy"]["buckets"]]
    plot_answers([("load test: estimate vs truth", answer, truth)], estimates)
    return [throughput, latency, estimates]


def run_loadtest(config: LoadConfig) -> dict[str, Any]:
    """Run, print the summary, write plots (and JSON if asked); returns the result."""
    config.check()
    if config.progress:
        where = (
            f"shuffler {config.shuffler}, aggregator {config.aggregator}"
            if config.shuffler
            else "services started here (loopback, temporary directory)"
        )
        print(
            f"load test: {config.devices:,} devices, {config.pattern}, mean {config.rate:,.0f}/s"
            f" over {config.duration_s:g} s; {where}",
            flush=True,
        )
    with tempfile.TemporaryDirectory(prefix="deniable-loadtest-") as tmp:
        base = config.workdir or Path(tmp)
        result, latency = asyncio.run(_run_and_latency(config, base))
    print(format_summary(result))
    for path in write_plots(result, latency, config.out_dir):
        print(f"wrote {path}")
    render.write_json(result, config.json_path)
    return result


async def _run_and_latency(config: LoadConfig, workdir: Path) -> tuple[dict[str, Any], FloatArray]:
    result = await _run(config, workdir)
    return result, np.asarray(result.pop("_latency_ms", []), dtype=np.float64)
