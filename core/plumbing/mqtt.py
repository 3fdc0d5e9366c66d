"""The MQTT contract shared by devices and the shuffler: topic names, request ids, broker settings.

Devices that live on a broker take part over MQTT beside gRPC (docs/mqtt.md, ADR 0009):

- ``<prefix>/campaigns/<campaign id>``: retained, QoS 1, a serialized ``Campaign``, published by
  the shuffler as it relays the aggregator's campaign descriptions;
- ``<prefix>/submit/<user>/<request id>``: QoS 1, a serialized ``SubmitReportsRequest`` from a
  device logged in as ``<user>`` (the broker's ACL pattern ``%u`` makes the user level true, so
  the shuffler's per-user quota counts it; ADR 0032); ``<prefix>/submit/<request id>`` from a
  device without a login, counted as one shared source;
- ``<prefix>/ack/<request id>``: QoS 1, the shuffler's ``SubmitAck`` once the accepted reports
  are durably spooled. The broker's PUBACK only says the broker has the message; the device
  keeps its reports in the outbox until this answer arrives.

A request id is 128 fresh random bits per attempt, never a device identifier: it only routes one
answer back and links nothing across requests.
"""

from __future__ import annotations

import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Final

from deniable.core.errors import ConfigurationError
from deniable.core.rng import default_rng

DEFAULT_PREFIX: Final = "deniable/v1"
SOCKET_OPTIONS: Final = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)
"""For every client: without TCP_NODELAY a small publish right after another write (the shuffler's
answer after its PUBACK) waits for the broker's delayed ACK, ≈ 40 ms, measured."""
DEFAULT_PORT: Final = 1883
_REQUEST_ID = re.compile(r"[0-9a-f]{32}")
_USER = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_PREFIX = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*")


def new_request_id() -> str:
    """A fresh 128-bit request id from the CSPRNG, as 32 lowercase hex digits."""
    return f"{default_rng().randbits(128):032x}"


def valid_request_id(text: str) -> bool:
    """True for exactly 32 lowercase hex digits (what ``new_request_id`` makes)."""
    return _REQUEST_ID.fullmatch(text) is not None


def check_prefix(prefix: str) -> str:
    """The prefix if it is a plain topic path (no wildcards, no leading or trailing '/')."""
    if not _PREFIX.fullmatch(prefix):
        raise ConfigurationError(f"MQTT topic prefix {prefix!r} must be words joined by '/', no wildcards")
    return prefix


def campaign_topic(prefix: str, campaign_id: str) -> str:
    """Where the campaign's description is retained."""
    return f"{prefix}/campaigns/{campaign_id}"


def valid_user(user: str) -> bool:
    """True for a broker login that can be one topic level: 1..64 of letters, digits, ``_.@-``."""
    return _USER.fullmatch(user) is not None


def submit_topic(prefix: str, request_id: str, user: str | None = None) -> str:
    """Where a device publishes one SubmitReportsRequest (under its login when it has one)."""
    if user is not None and valid_user(user):
        return f"{prefix}/submit/{user}/{request_id}"
    return f"{prefix}/submit/{request_id}"


def submit_of(prefix: str, topic: str) -> tuple[str | None, str] | None:
    """(user or None, request id) of a submit topic, or None if the topic is not one."""
    head = f"{prefix}/submit/"
    if not topic.startswith(head):
        return None
    user, _, request_id = topic[len(head) :].rpartition("/")
    if not valid_request_id(request_id) or (user and not valid_user(user)):
        return None
    return (user or None), request_id


def ack_topic(prefix: str, request_id: str) -> str:
    """Where the shuffler answers that request."""
    return f"{prefix}/ack/{request_id}"


def request_id_of(prefix: str, topic: str) -> str | None:
    """The request id of a submit topic, or None if the topic is not one."""
    found = submit_of(prefix, topic)
    return None if found is None else found[1]


@dataclass(frozen=True)
class BrokerAddress:
    """Where the broker is and how to log in; TLS when ``tls`` is set."""

    host: str
    port: int = DEFAULT_PORT
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: ssl.SSLContext | None = None

    @classmethod
    def parse(cls, text: str) -> BrokerAddress:
        """``HOST[:PORT]`` (IPv6 in brackets); ConfigurationError in one line otherwise."""
        host, port = text, DEFAULT_PORT
        if text.startswith("["):
            host, _, rest = text[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
            if rest and not rest.startswith(":"):
                raise ConfigurationError(f"MQTT broker address {text!r} is not HOST[:PORT]")
        elif text.count(":") == 1:
            host, _, port_text = text.partition(":")
        else:
            port_text = ""
        if port_text:
            try:
                port = int(port_text)
            except ValueError:
                raise ConfigurationError(f"MQTT broker port in {text!r} is not a number") from None
        if not host or not 0 < port < 65536:
            raise ConfigurationError(f"MQTT broker address {text!r} is not HOST[:PORT]")
        return cls(host, port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"
