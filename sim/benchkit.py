"""Shared machinery of ``deniable bench`` and ``deniable loadtest``.

- the real services in child processes (spawned, so each has its own interpreter lock and its
  CPU time and memory can be read apart), on loopback, with any configuration;
- CPU seconds and peak RSS of a process and its descendants, from ``/proc`` (Linux);
- simulated devices sealing reports on every core (randomise → encode → seal, the SDK's path);
- SubmitReports requests pre-encoded as bytes, so the load generator costs little CPU and the
  numbers describe the services, not the driver.

Nothing here uses ``random`` or ``numpy.random``: true values are deterministic populations,
noise comes from the mechanisms' CSPRNG.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import multiprocessing
import os
import platform
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

import grpc
import numpy as np
import numpy.typing as npt

from deniable.core.protowire import report_element
from deniable.v1 import deniable_pb2 as pb

SUBMIT_METHOD: Final = "/deniable.v1.Shuffler/SubmitReports"
INGEST_METHOD: Final = "/deniable.v1.Aggregator/IngestBatch"
REQUEST_REPORTS: Final = 1000
"""Reports per SubmitReports request from simulated devices (a gateway's batch)."""
_CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory_gb = 0.0
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpu": model or platform.processor() or "unknown",
        "cores": cores(),
        "memory_gb": memory_gb,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "load_average_at_start": [round(x, 2) for x in load],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


# --- /proc: CPU time and memory of process trees ---------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rindex(")") + 2 :].split()  # fields from 3 (state) on; the name may hold spaces


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = _stat_fields(int(entry))
                if fields is not None:
                    children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def process_tree(pid: int) -> list[int]:
    """``pid`` and its living descendants."""
    children = _children_map()
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending.extend(children.get(current, []))
    return found


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid``, its living descendants, and the children they reaped."""
    total = 0
    for member in process_tree(pid):
        fields = _stat_fields(member)
        if fields is not None:  # utime, stime, cutime, cstime are fields 14..17
            total += sum(int(x) for x in fields[11:15])
    return total / _CLOCK_TICKS


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of one living process, in MiB; 0 if unknown."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def proc_available() -> bool:
    """Whether CPU and memory can be read from /proc."""
    return Path(f"/proc/{os.getpid()}/stat").exists()


# --- services in child processes ---------------------------------------------------------------


def _service_main(kind: str, settings: dict[str, Any], conn: Connection) -> None:
    """Child process: run one service until the parent says stop, then report usage."""
    asyncio.run(_serve(kind, settings, conn))


async def _serve(kind: str, settings: dict[str, Any], conn: Connection) -> None:
    import resource

    from deniable.core.plumbing.logs import configure_logging

    configure_logging(str(settings.pop("log_level", "warning")))
    settings = dict(settings, data_dir=Path(settings["data_dir"]))
    settings.setdefault("insecure", True)  # benchmarks measure the pipeline in plaintext, by name
    if kind == "shuffler":
        settings.setdefault("quota_per_source", 0)  # every simulated device shares 127.0.0.1
    running: Any
    try:
        if kind == "aggregator":
            from deniable.aggregator import AggregatorConfig, start_aggregator

            running = await start_aggregator(AggregatorConfig(**settings))
        else:
            from deniable.shuffler import ShufflerConfig, start_shuffler

            running = await start_shuffler(ShufflerConfig(**settings))
    except Exception as exc:
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
        return
    conn.send({"address": running.address, "pid": os.getpid(), "metrics_port": running.metrics_port})
    loop = asyncio.get_running_loop()
    asked = asyncio.Event()
    loop.add_reader(conn.fileno(), asked.set)
    try:
        await asked.wait()
    finally:
        loop.remove_reader(conn.fileno())
    with contextlib.suppress(EOFError, OSError):
        conn.recv()
    await running.stop()
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    with contextlib.suppress(OSError):
        conn.send(
            {
                "cpu_s": own.ru_utime + own.ru_stime,
                "children_cpu_s": reaped.ru_utime + reaped.ru_stime,
                "peak_rss_mb": own.ru_maxrss / 1024,
                "children_peak_rss_mb": reaped.ru_maxrss / 1024,
            }
        )


@dataclass
class ServiceProcess:
    """A shuffler or aggregator in a spawned child process; ``stop`` returns its own rusage."""

    kind: str
    settings: dict[str, Any]
    address: str = ""
    pid: int = 0
    metrics_port: int | None = None
    _process: Any = field(default=None, repr=False)
    _conn: Connection | None = field(default=None, repr=False)

    def start(self, timeout_s: float = 120.0) -> str:
        """Spawn, wait until it listens; returns its address (RuntimeError if it failed)."""
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.settings.items()}
        # Not a daemon: the aggregator starts its own decryption processes.
        self._process = context.Process(
            target=_service_main, args=(self.kind, settings, child), name=f"deniable-{self.kind}"
        )
        self._process.start()
        child.close()
        self._conn = parent
        if not parent.poll(timeout_s):
            self.kill()
            raise RuntimeError(f"{self.kind} did not start within {timeout_s:g} s")
        try:
            hello = parent.recv()
        except EOFError:
            self.kill()
            raise RuntimeError(f"{self.kind} exited while starting") from None
        if "error" in hello:
            self.kill()
            raise RuntimeError(f"{self.kind} failed to start: {hello['error']}")
        self.address, self.pid = str(hello["address"]), int(hello["pid"])
        self.metrics_port = hello.get("metrics_port")
        return self.address

    def cpu_seconds(self) -> float:
        """CPU used so far by the service and its worker processes (from /proc)."""
        return tree_cpu_seconds(self.pid) if self.pid else 0.0

    def peak_rss_mb(self) -> float:
        """Peak RSS of the service process itself so far (its workers are not included)."""
        return peak_rss_mb(self.pid) if self.pid else 0.0

    def stop(self, timeout_s: float = 60.0) -> dict[str, float]:
        """Graceful stop; returns the child's getrusage figures ({} if it had to be killed)."""
        usage: dict[str, float] = {}
        conn, process = self._conn, self._process
        self._conn = None
        if conn is not None and process is not None and process.is_alive():
            with contextlib.suppress(OSError, BrokenPipeError):
                conn.send("stop")
                if conn.poll(timeout_s):
                    with contextlib.suppress(EOFError):
                        usage = dict(conn.recv())
            conn.close()
        if process is not None:
            process.join(timeout_s)
            if process.is_alive():
                self.kill()
        return usage

    def kill(self) -> None:
        """Last resort: terminate the child (and with it, in time, its pool)."""
        process = self._process
        if process is not None and process.is_alive():
            process.terminate()
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(10)


def check_loopback(address: str) -> None:
    """ValueError unless ``address`` (host:port) is on this machine: load tests stay on loopback."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"{address}: load tests only run against loopback addresses (127.0.0.1, ::1)")


def aggregator_process(data_dir: Path, workers: int, metrics: bool = True) -> ServiceProcess:
    """An aggregator on a free loopback port with ``workers`` decryption processes (not started)."""
    settings: dict[str, Any] = {"data_dir": data_dir, "listen": "127.0.0.1:0", "decrypt_workers": workers}
    if metrics:
        settings["metrics_port"] = 0
    return ServiceProcess("aggregator", settings)


def shuffler_process(data_dir: Path, upstream: str, **settings: Any) -> ServiceProcess:
    """A shuffler on a free loopback port forwarding to ``upstream`` (not started)."""
    return ServiceProcess(
        "shuffler", {"data_dir": data_dir, "upstream": upstream, "listen": "127.0.0.1:0"} | settings
    )


def bucket_campaign_request(
    campaign_id: str, buckets: int, epsilon0: float, n_min: int, purpose: str = "benchmark", **extra: Any
) -> pb.CreateCampaignRequest:
    """A categorical campaign over ``bucket-0`` .. ``bucket-{buckets-1}`` (GRR unless ``extra`` says)."""
    request = pb.CreateCampaignRequest(
        id=campaign_id,
        question=f"Which of {buckets} buckets? ({purpose})",
        kind=pb.CATEGORICAL,
        labels=[f"bucket-{i}" for i in range(buckets)],
        mechanism=pb.GRR,
        epsilon0=epsilon0,
        delta=1e-6,
        n_min=n_min,
    )
    for name, value in extra.items():
        setattr(request, name, value)
    return request


def say(progress: bool, text: str) -> None:
    """A progress line, when asked for."""
    if progress:
        print(text, flush=True)


# --- simulated devices: sealing on every core ---------------------------------------------------


def _warm(_: int) -> int:
    """Import the heavy modules in a pool worker (so pool start-up stays out of timings)."""
    import deniable.aggregator.decrypt
    import deniable.client.reporter  # noqa: F401

    time.sleep(0.2)  # long enough that every worker gets one
    return os.getpid()


def start_pool(workers: int) -> ProcessPoolExecutor:
    """A spawned process pool with every worker started and warm."""
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    list(pool.map(_warm, range(workers)))
    return pool


def _seal_chunk(campaign_blob: bytes, values: list[int]) -> tuple[bytes, int, float]:
    """Worker: randomise, encode and seal one report per value (each message apart).

    Returns the ciphertexts back to back (all of the campaign's fixed length), their number, and
    the CPU seconds it took.
    """
    from deniable.core.campaigns import randomiser_for
    from deniable.core.crypto import PublicKey, seal_report
    from deniable.core.wire import Plaintext, encode, new_report_id

    started = time.process_time()
    campaign = pb.Campaign.FromString(campaign_blob)
    randomiser = randomiser_for(campaign)
    key = PublicKey(campaign.key_id, bytes(campaign.public_key))
    parts = []
    for payload in randomiser.randomise_many(values):
        for message in randomiser.split_messages(payload):
            plaintext = encode(
                Plaintext(new_report_id(), campaign.id, campaign.key_id, message), campaign.plaintext_length
            )
            parts.append(seal_report(plaintext, key, campaign.id, campaign.incarnation))
    return b"".join(parts), len(parts), time.process_time() - started


@dataclass
class Sealed:
    """Pre-sealed reports of one campaign, in device order, and what sealing them cost."""

    campaign: pb.Campaign
    ciphertexts: list[bytes]
    wall_s: float
    cpu_s: float
    devices: int

    @property
    def count(self) -> int:
        """Number of sealed messages."""
        return len(self.ciphertexts)


def seal_population(
    campaign: pb.Campaign,
    values: Sequence[int] | npt.NDArray[np.int64],
    pool: ProcessPoolExecutor,
    workers: int,
    progress: Callable[[int], object] | None = None,
) -> Sealed:
    """Seal one report per value on ``workers`` processes of ``pool`` (timed; chunks of 2,000)."""
    blob = campaign.SerializeToString()
    width = campaign.ciphertext_length
    chunk = max(1, min(2000, -(-len(values) // max(1, workers))))
    started = time.perf_counter()
    futures = [
        pool.submit(_seal_chunk, blob, [int(v) for v in values[i : i + chunk]])
        for i in range(0, len(values), chunk)
    ]
    ciphertexts: list[bytes] = []
    cpu = 0.0
    for future, start in zip(futures, range(0, len(values), chunk), strict=True):
        joined, count, used = future.result()
        cpu += used
        ciphertexts.extend(joined[i * width : (i + 1) * width] for i in range(count))
        if progress is not None:
            progress(min(chunk, len(values) - start))
    return Sealed(campaign, ciphertexts, time.perf_counter() - started, cpu, len(values))


# --- wire helpers ---------------------------------------------------------------------------------


def seal_with_bar(
    campaign: pb.Campaign, values: Any, pool: ProcessPoolExecutor, workers: int, desc: str, progress: bool
) -> Sealed:
    """``seal_population`` with a progress bar (blocking: call it in a thread)."""
    from tqdm import tqdm

    with tqdm(total=len(values), desc=desc, unit="report", disable=not progress) as bar:
        return seal_population(campaign, values, pool, workers, bar.update)


def report_elements(
    campaign_id: str, key_id: int, ciphertexts: Sequence[bytes], field_number: int
) -> list[bytes]:
    """Each report as one encoded element of a ``repeated EncryptedReport`` field.

    Concatenating elements gives a valid message (SubmitReportsRequest: field 1); encoding each
    report once lets a driver form requests of any size without protobuf work at send time.
    """
    cid = campaign_id.encode()
    return [report_element(cid, key_id, ciphertext, field_number) for ciphertext in ciphertexts]


def submit_callable(channel: grpc.aio.Channel) -> Any:
    """SubmitReports taking pre-encoded request bytes."""
    return channel.unary_unary(
        SUBMIT_METHOD,
        request_serializer=lambda raw: raw,
        response_deserializer=pb.SubmitReportsResponse.FromString,
    )


@dataclass
class SubmitOutcome:
    """What a run of SubmitReports calls achieved."""

    acknowledged: int = 0
    rejected: int = 0
    rejections: dict[str, int] = field(default_factory=dict)
    failed_requests: int = 0
    first_sent: float = 0.0
    last_acked: float = 0.0


async def submit_requests(
    address: str,
    requests: Sequence[tuple[bytes, int]],
    concurrency: int,
    on_ack: Callable[[int], None] | None = None,
    timeout_s: float = 60.0,
    attempts: int = 3,
) -> SubmitOutcome:
    """Send pre-encoded (request, report count) pairs with ``concurrency`` calls in flight.

    Each request is tried at most ``attempts`` times (retryable failures), each call has a
    deadline: the loop is bounded in count and time.
    """
    from deniable.client.transport import RETRYABLE_CODES

    outcome = SubmitOutcome()
    channel = grpc.aio.insecure_channel(
        address,
        options=[("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)],
    )
    submit = submit_callable(channel)
    queue = list(reversed(requests))
    outcome.first_sent = time.perf_counter()

    async def worker() -> None:
        while queue:
            raw, count = queue.pop()
            for attempt in range(attempts):
                try:
                    response: pb.SubmitReportsResponse = await submit(raw, timeout=timeout_s)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() in RETRYABLE_CODES and attempt + 1 < attempts:
                        await asyncio.sleep(0.05 * 2**attempt)
                        continue
                    outcome.failed_requests += 1
                    break
                outcome.acknowledged += response.accepted
                outcome.rejected += len(response.rejected)
                for rejection in response.rejected:
                    name = pb.RejectReason.Name(rejection.reason)
                    outcome.rejections[name] = outcome.rejections.get(name, 0) + 1
                outcome.last_acked = time.perf_counter()
                if on_ack is not None:
                    on_ack(count)
                break

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    finally:
        await channel.close()
    return outcome


def chunk_requests(elements: Sequence[bytes], size: int = REQUEST_REPORTS) -> list[tuple[bytes, int]]:
    """Consecutive elements joined into requests of ``size`` reports."""
    return [
        (b"".join(elements[i : i + size]), len(elements[i : i + size])) for i in range(0, len(elements), size)
    ]


def plaintext_channel(address: str) -> grpc.aio.Channel:
    """A plaintext channel to a benchmark's service (they run ``insecure``, on loopback)."""
    from deniable.core.plumbing.service import insecure_channel

    return insecure_channel(address)


async def aggregator_query(address: str, campaign_id: str, binary: bool = False) -> pb.QueryResponse:
    """One Histogram (or BinarySum) query."""
    from deniable.v1 import deniable_pb2_grpc as pb_grpc

    channel = plaintext_channel(address)
    try:
        stub = pb_grpc.AggregatorStub(channel)
        rpc = stub.BinarySum if binary else stub.Histogram
        answer: pb.QueryResponse = await rpc(pb.QueryRequest(campaign_id=campaign_id), timeout=120)
        return answer
    finally:
        await channel.close()


async def create_campaign(address: str, request: pb.CreateCampaignRequest) -> pb.Campaign:
    """CreateCampaign at the aggregator."""
    from deniable.v1 import deniable_pb2_grpc as pb_grpc

    channel = plaintext_channel(address)
    try:
        created: pb.Campaign = await pb_grpc.AggregatorStub(channel).CreateCampaign(request, timeout=60)
        return created
    finally:
        await channel.close()


async def flush_shuffler(address: str, campaign_id: str = "", below_n_min: bool = False) -> pb.FlushResponse:
    """Operator flush: batch and forward now."""
    from deniable.v1 import deniable_pb2_grpc as pb_grpc

    channel = plaintext_channel(address)
    try:
        request = pb.FlushRequest(campaign_id=campaign_id, below_n_min=below_n_min)
        flushed: pb.FlushResponse = await pb_grpc.ShufflerStub(channel).Flush(request, timeout=600)
        return flushed
    finally:
        await channel.close()


def scrape_counted(metrics_port: int) -> int:
    """Reports the aggregator has counted or rejected so far, from its Prometheus endpoint."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(
            ("deniable_aggregator_reports_counted_total", "deniable_aggregator_reports_rejected_total")
        ):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


async def wait_counted(
    address: str,
    campaign_id: str,
    expected: int,
    timeout_s: float,
    metrics_port: int | None = None,
    baseline: int = 0,
) -> tuple[pb.QueryResponse, float]:
    """Wait until the aggregator counted (or rejected) ``expected`` messages; (answer, when).

    With a metrics port the wait polls the cheap Prometheus counters (``baseline`` is their value
    before this campaign's reports arrived); otherwise it polls the query, less often (a query
    also computes the privacy statement). The answer is one final query.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metrics_port is not None:
            if await asyncio.to_thread(scrape_counted, metrics_port) - baseline >= expected:
                break
            await asyncio.sleep(0.02)
        else:
            answer = await aggregator_query(address, campaign_id)
            if answer.messages + answer.rejected >= expected:
                break
            await asyncio.sleep(0.25)
    reached = time.perf_counter()
    return await aggregator_query(address, campaign_id), reached
