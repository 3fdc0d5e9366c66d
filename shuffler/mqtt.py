"""The shuffler's MQTT face: report ingestion and campaign announcements on a broker, beside gRPC.

``MqttIngress`` subscribes to ``<prefix>/submit/+`` and hands each SubmitReportsRequest to the
same ``ShufflerHandlers.submit`` the gRPC servicer calls, so the envelope checks, the durable
spool and the answers are identical; the answer (``SubmitAck``) goes to ``<prefix>/ack/<id>``
only after the spool write. It retains every campaign the aggregator lists on
``<prefix>/campaigns/<id>`` and republishes what changed every ``announce_interval_s``.

What identifies a sender stays out: the request id routes one answer and is forgotten, the
broker's client ids never reach this code, nothing is logged per message. Bad input (a
malformed topic, bytes that are not a request, an oversized message) is counted by reason and
answered with a status where there is somewhere to answer; it never stops the loop. A lost
broker connection is retried with capped backoff; reports a device published meanwhile are
resent by its outbox, and the aggregator counts a report id once.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import grpc
from prometheus_client import Counter

from deniable.core.backoff import Backoff
from deniable.core.errors import RequestRefused
from deniable.core.ids import valid_campaign_id
from deniable.core.plumbing import mqtt
from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.core.plumbing.service import status_code
from deniable.core.rng import default_rng
from deniable.shuffler.handlers import ShufflerHandlers
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.shuffler.rawsubmit import RawSubmit
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import aiomqtt
else:  # the [mqtt] extra: imported when a broker is first used
    from deniable.core.lazy import LazyModule

    aiomqtt = LazyModule("aiomqtt", "MQTT needs aiomqtt: pip install 'deniable[mqtt]'")

log = logging.getLogger("deniable.shuffler.mqtt")

SHARED_GROUP: Final = "deniable-shufflers"


@dataclass(frozen=True)
class MqttIngressConfig:
    """Broker, topic prefix and limits of the shuffler's MQTT face."""

    broker: BrokerAddress
    prefix: str = mqtt.DEFAULT_PREFIX
    max_message_bytes: int = 16 * 1024 * 1024
    concurrency: int = 32
    """Requests handled at once; the broker holds the rest (QoS 1)."""
    announce_interval_s: float = 10.0
    reconnect_base_s: float = 0.5
    reconnect_max_s: float = 30.0
    shared_subscription: bool = False
    """Subscribe as ``$share/deniable-shufflers/...`` so replicas split the requests (MQTT 5 brokers)."""


@dataclass
class MqttMetrics:
    """Counters of the MQTT face, registered in the shuffler's registry."""

    metrics: ShufflerMetrics
    messages: Counter = field(init=False)
    dropped: Counter = field(init=False)
    connects: Counter = field(init=False)
    announcements: Counter = field(init=False)

    def __post_init__(self) -> None:
        registry = self.metrics.registry
        self.messages = Counter(
            "deniable_shuffler_mqtt_requests", "Submit requests received over MQTT.", registry=registry
        )
        self.dropped = Counter(
            "deniable_shuffler_mqtt_dropped",
            "MQTT messages refused before the handlers, by reason.",
            ["reason"],
            registry=registry,
        )
        self.connects = Counter(
            "deniable_shuffler_mqtt_connects", "Connections made to the broker.", registry=registry
        )
        self.announcements = Counter(
            "deniable_shuffler_mqtt_announcements",
            "Campaign descriptions published (retained) to the broker.",
            registry=registry,
        )


class MqttIngress:
    """Runs beside the gRPC server: ``start`` connects in the background, ``stop`` ends it."""

    def __init__(
        self,
        handlers: ShufflerHandlers,
        metrics: ShufflerMetrics,
        config: MqttIngressConfig,
    ) -> None:
        """Nothing connects until ``start``."""
        mqtt.check_prefix(config.prefix)
        self._handlers = handlers
        self._service_metrics = metrics
        self.metrics = MqttMetrics(metrics)
        self.config = config
        self._client: aiomqtt.Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(config.concurrency)
        self._inflight: set[asyncio.Task[None]] = set()
        self._announced: dict[str, bytes] = {}
        self.connected = asyncio.Event()

    def start(self) -> None:
        """Connect (and keep reconnecting) in a background task."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mqtt-ingress")

    async def stop(self) -> None:
        """Finish the requests being handled (their answers are published), then disconnect."""
        if self._task is None:
            return
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None

    async def announce_now(self) -> int:
        """Publish changed campaign descriptions at once (tests and operators); how many were sent."""
        client = self._client
        if client is None:
            return 0
        return await self._announce(client)

    async def _run(self) -> None:
        backoff = Backoff(self.config.reconnect_base_s, self.config.reconnect_max_s)
        while True:
            try:
                await self._session()
                backoff.succeeded()
            except aiomqtt.MqttError as exc:
                self.connected.clear()
                self._client = None
                delay = backoff.failed()
                log.warning(
                    "MQTT broker connection failed; retrying", extra={"error": str(exc), "in_s": delay}
                )
                await asyncio.sleep(delay)

    async def _session(self) -> None:
        """One broker connection: subscribe, announce, handle requests until it drops."""
        broker = self.config.broker
        if broker.tls is None:
            log.warning(
                "INSECURE: plaintext MQTT to %s:%s (--mqtt-insecure; tests only)", broker.host, broker.port
            )
        identifier = f"deniable-shuffler-{default_rng().randbits(64):016x}"
        async with aiomqtt.Client(
            broker.host,
            broker.port,
            identifier=identifier,
            username=broker.username,
            password=broker.password,
            tls_context=broker.tls,
            protocol=aiomqtt.ProtocolVersion.V5 if self.config.shared_subscription else None,
            max_queued_incoming_messages=4 * self.config.concurrency,
            socket_options=mqtt.SOCKET_OPTIONS,
        ) as client:
            topic = mqtt.submit_topic(self.config.prefix, "+")
            if self.config.shared_subscription:
                topic = f"$share/{SHARED_GROUP}/{topic}"
            await client.subscribe(topic, qos=1)
            self._client = client
            self._announced.clear()  # the broker may have restarted without its retained messages
            self.metrics.connects.inc()
            self.connected.set()
            log.info("MQTT ingress connected", extra={"broker": str(broker), "prefix": self.config.prefix})
            announcer = asyncio.create_task(self._announce_forever(client))
            try:
                async for message in client.messages:
                    await self._slots.acquire()
                    task = asyncio.create_task(self._handle(client, message))
                    self._inflight.add(task)
                    task.add_done_callback(self._finished)
            finally:
                announcer.cancel()
                await asyncio.gather(announcer, return_exceptions=True)
                if self._inflight:
                    await asyncio.gather(*self._inflight, return_exceptions=True)
                self._client = None
                self.connected.clear()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._slots.release()

    async def _handle(self, client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        """One request: checks, the handlers, the answer. Never raises."""
        try:
            request_id = mqtt.request_id_of(self.config.prefix, message.topic.value)
            if request_id is None:
                self.metrics.dropped.labels(reason="bad_topic").inc()  # nowhere to answer
                return
            ack = await self._answer(message.payload)
            await client.publish(
                mqtt.ack_topic(self.config.prefix, request_id), ack.SerializeToString(), qos=1
            )
        except aiomqtt.MqttError:
            # Connection lost before the answer left: the device times out and resends; the
            # spool may hold the reports already and the aggregator counts each report id once.
            self.metrics.dropped.labels(reason="answer_lost").inc()
        except Exception:
            log.exception("unexpected failure handling an MQTT request")
            self.metrics.dropped.labels(reason="internal").inc()

    async def _answer(self, payload: object) -> pb.SubmitAck:
        """The SubmitAck for one payload, as the gRPC servicer would answer it."""
        self.metrics.messages.inc()
        if not isinstance(payload, bytes | bytearray):
            return self._refuse(grpc.StatusCode.INVALID_ARGUMENT, "the payload is not a SubmitReportsRequest")
        if len(payload) > self.config.max_message_bytes:
            message = f"request of {len(payload)} bytes; at most {self.config.max_message_bytes}"
            return self._refuse(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        try:
            response = await self._handlers.submit(RawSubmit(bytes(payload)))
        except RequestRefused as exc:
            return self._refuse(status_code(exc), str(exc))
        except Exception:
            log.exception("unexpected failure in submit over MQTT")
            return self._refuse(grpc.StatusCode.INTERNAL, "internal error")
        return pb.SubmitAck(response=response)

    def _refuse(self, code: grpc.StatusCode, message: str) -> pb.SubmitAck:
        """Count the failure as the servicer does and answer with the status, nothing spooled."""
        self._service_metrics.requests_failed.labels(rpc="MqttSubmit", code=code.name).inc()
        return pb.SubmitAck(status_code=code.value[0], status_message=message)

    async def _announce_forever(self, client: aiomqtt.Client) -> None:
        """Announce every interval until the connection ends; a failed round is logged, not fatal."""
        while True:
            try:
                await self._announce(client)
            except aiomqtt.MqttError:
                return  # the session's message loop sees the lost connection and reconnects
            except RequestRefused as exc:
                log.warning("cannot list campaigns to announce", extra={"error": str(exc)})
            except Exception:
                log.exception("unexpected failure announcing campaigns")
            await asyncio.sleep(self.config.announce_interval_s)

    async def _announce(self, client: aiomqtt.Client) -> int:
        """Retain each listed campaign whose description changed since it was last published."""
        listed = await self._handlers.list_campaigns()
        sent = 0
        for campaign in listed.campaigns:
            if not valid_campaign_id(campaign.id):
                continue
            body = campaign.SerializeToString(deterministic=True)
            if self._announced.get(campaign.id) == body:
                continue
            await client.publish(
                mqtt.campaign_topic(self.config.prefix, campaign.id), body, qos=1, retain=True
            )
            self._announced[campaign.id] = body
            self.metrics.announcements.inc()
            sent += 1
        return sent
