"""``MqttTransport``: the device's way to the shuffler through an MQTT broker (IoT devices).

The same ``Transport`` contract as gRPC, so the Reporter, its outbox and its retries work
unchanged. A submit publishes the SubmitReportsRequest on ``<prefix>/submit/<request id>``
(QoS 1, a fresh random id per attempt) and waits for the shuffler's ``SubmitAck`` on
``<prefix>/ack/<request id>``: only that answer, sent after the durable spool write, lets the
outbox forget a report (the broker's PUBACK would not). Campaigns are read from the retained
``<prefix>/campaigns/<id>`` topic the shuffler keeps. Topics and ids: ``deniable.core.plumbing.mqtt``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import grpc
from google.protobuf.message import DecodeError

from deniable.client.transport import RETRYABLE_CODES, TransportError
from deniable.core.errors import ConfigurationError
from deniable.core.ids import valid_campaign_id
from deniable.core.plumbing import mqtt
from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import aiomqtt
else:  # the [mqtt] extra: imported when a broker is first used
    from deniable.core.lazy import LazyModule

    aiomqtt = LazyModule("aiomqtt", "MQTT needs aiomqtt: pip install 'deniable[mqtt]'")

log = logging.getLogger("deniable.client.mqtt")
_CODES: Final = {code.value[0]: code for code in grpc.StatusCode}


class _Session:
    """One broker connection and the task that routes each incoming message to its waiters."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.waiters: dict[str, list[asyncio.Future[bytes]]] = {}
        self.alive = True
        self.reader = asyncio.create_task(self._read(), name="mqtt-transport-reader")

    async def _read(self) -> None:
        try:
            async for message in self.client.messages:
                payload = message.payload
                if not isinstance(payload, bytes | bytearray):
                    continue
                for waiter in self.waiters.get(message.topic.value, ()):
                    if not waiter.done():
                        waiter.set_result(bytes(payload))
        except aiomqtt.MqttError:
            pass
        finally:
            self.alive = False
            for waiters in self.waiters.values():
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(
                            TransportError("lost the MQTT broker connection", retryable=True)
                        )

    async def exchange(
        self, listen: str, publish: tuple[str, bytes] | None, timeout_s: float, what: str
    ) -> bytes:
        """Subscribe to ``listen``, publish, and return the first message on ``listen``.

        Several callers may wait on one topic at once (two look-ups of one campaign): each
        subscribe makes the broker resend the retained message, and the topic is unsubscribed
        when the last of them is done.
        """
        waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiters.setdefault(listen, []).append(waiter)
        try:
            await self.client.subscribe(listen, qos=1, timeout=timeout_s)
            if publish is not None:
                await self.client.publish(publish[0], publish[1], qos=1, timeout=timeout_s)
            return await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            raise TransportError(f"{what}: no answer within {timeout_s:g} s", retryable=True) from None
        except aiomqtt.MqttError as exc:
            self.alive = False
            raise TransportError(f"{what} failed: {exc}", retryable=True) from exc
        finally:
            waiting = self.waiters[listen]
            waiting.remove(waiter)
            if not waiting:
                del self.waiters[listen]
                if self.alive:
                    with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
                        await self.client.unsubscribe(listen, timeout=timeout_s)

    async def close(self) -> None:
        self.alive = False
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)
        with contextlib.suppress(aiomqtt.MqttError):
            await self.client.__aexit__(None, None, None)


def _with_tls(broker: BrokerAddress, ca: Path | None, insecure: bool) -> BrokerAddress:
    """``broker`` with a verifying TLS context unless it has one or plaintext is asked for by name."""
    if insecure:
        if broker.tls is not None or ca is not None:
            raise ValueError("choose TLS (a CA or the broker's tls context) or insecure, not both")
        log.warning(
            "INSECURE: plaintext MQTT to %s:%s (asked for by name; tests only)", broker.host, broker.port
        )
        return broker
    if broker.tls is not None:
        return broker
    try:
        context = ssl.create_default_context(cafile=None if ca is None else str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot use {ca} as the MQTT broker's CA: {exc}") from exc
    return dataclasses.replace(broker, tls=context)


class MqttTransport:
    """The shuffler behind an MQTT broker over TLS; connects on first use, reconnects after a failure."""

    def __init__(
        self,
        broker: BrokerAddress | str,
        *,
        prefix: str = mqtt.DEFAULT_PREFIX,
        timeout_s: float = 10.0,
        campaign_wait_s: float = 3.0,
        ca: Path | None = None,
        insecure: bool = False,
    ) -> None:
        """``broker``: a BrokerAddress or ``HOST[:PORT]``; ``timeout_s`` bounds each answer's wait,
        ``campaign_wait_s`` the wait for a retained campaign (it arrives at once if there is one).

        The broker's certificate is verified (``broker.tls``, else a context trusting ``ca`` or the
        system roots); ``insecure=True`` connects in plaintext, for tests only.
        """
        if timeout_s <= 0 or campaign_wait_s <= 0:
            raise ValueError("timeout_s and campaign_wait_s must be positive")
        self.campaign_wait_s = campaign_wait_s
        address = broker if isinstance(broker, BrokerAddress) else BrokerAddress.parse(broker)
        self.broker = _with_tls(address, ca, insecure)
        self.prefix = mqtt.check_prefix(prefix)
        self.timeout_s = timeout_s
        self._session: _Session | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting = asyncio.Lock()

    async def _connected(self) -> _Session:
        """The live session of this loop, connecting if there is none."""
        loop = asyncio.get_running_loop()
        if self._session is not None and self._session.alive and self._loop is loop:
            return self._session
        if self._loop is not loop:
            self._session, self._connecting = None, asyncio.Lock()
        async with self._connecting:
            if self._session is not None and self._session.alive:
                return self._session
            if self._session is not None:
                await self._session.close()
                self._session = None
            broker = self.broker
            client = aiomqtt.Client(
                broker.host,
                broker.port,
                identifier=f"deniable-device-{mqtt.new_request_id()[:16]}",  # per connection, not per device
                username=broker.username,
                password=broker.password,
                tls_context=broker.tls,
                timeout=self.timeout_s,
                socket_options=mqtt.SOCKET_OPTIONS,
            )
            try:
                await client.__aenter__()
            except aiomqtt.MqttError as exc:
                raise TransportError(
                    f"cannot reach the MQTT broker at {broker}: {exc}", retryable=True
                ) from exc
            self._session, self._loop = _Session(client), loop
            return self._session

    async def submit(self, reports: Sequence[pb.EncryptedReport]) -> pb.SubmitReportsResponse:
        """Publish one SubmitReportsRequest and wait for the shuffler's answer."""
        session = await self._connected()
        request_id = mqtt.new_request_id()
        body = pb.SubmitReportsRequest(reports=list(reports)).SerializeToString()
        raw = await session.exchange(
            mqtt.ack_topic(self.prefix, request_id),
            (mqtt.submit_topic(self.prefix, request_id), body),
            self.timeout_s,
            "SubmitReports over MQTT",
        )
        try:
            ack = pb.SubmitAck.FromString(raw)
        except DecodeError:
            raise TransportError("the shuffler's MQTT answer is not a SubmitAck", retryable=True) from None
        if ack.status_code:
            code = _CODES.get(ack.status_code, grpc.StatusCode.UNKNOWN)
            raise TransportError(
                f"SubmitReports failed: {code.name}: {ack.status_message}", code in RETRYABLE_CODES
            )
        return ack.response

    async def get_campaign(self, campaign_id: str) -> pb.Campaign:
        """The campaign the shuffler retains on the broker (retryable error if none is announced)."""
        if not valid_campaign_id(campaign_id):  # never a topic wildcard
            raise TransportError(
                f"GetCampaign failed: INVALID_ARGUMENT: bad campaign id {campaign_id!r}", False
            )
        session = await self._connected()
        topic = mqtt.campaign_topic(self.prefix, campaign_id)
        what = f"campaign {campaign_id!r} (not announced on the broker?)"
        raw = await session.exchange(topic, None, self.campaign_wait_s, what)
        try:
            return pb.Campaign.FromString(raw)
        except DecodeError:
            raise TransportError(
                f"campaign {campaign_id!r}: the retained message is not a Campaign", False
            ) from None

    async def close(self) -> None:
        """Disconnect; a later call connects again."""
        session, loop = self._session, self._loop
        self._session = self._loop = None
        if session is not None and loop is asyncio.get_running_loop():
            await session.close()
