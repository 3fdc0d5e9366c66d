"""The shipped NATS publish ACL (deploy/nats/nats.conf) on a real nats-server on loopback: only the
shuffler's user may publish to the ingest subject; the aggregator's user consumes and acks but
cannot inject a batch; no login, no connection. The control: the same logins on a server without
the permissions let the aggregator's user inject (issue 20, ADR 0030)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import ConsumerConfig
from support.processes import free_port, wait_listening

from deniable.core.plumbing import jetstream
from deniable.core.plumbing.jetstream import CONSUMER, STREAM, SUBJECT

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats.conf"
PASSWORDS = {"SHUFFLER_NATS_PASSWORD": "shuffler-secret", "AGGREGATOR_NATS_PASSWORD": "aggregator-secret"}


def _config(root: Path, port: int, acl: bool) -> Path:
    """The shipped file with only the port and the store made local (``acl=False``: permissions
    removed, the control)."""
    text = SHIPPED.read_text()
    text, listened = re.subn(r'(?m)^listen: "0\.0\.0\.0:4222"$', f'listen: "127.0.0.1:{port}"', text)
    text, stored = re.subn(r"/data/jetstream", str(root / "js"), text)
    assert listened == stored == 1
    if not acl:  # every permission block, reference and default gone
        text = re.sub(r", permissions: \$[A-Z]+", "", text)
        text = re.sub(r"(?ms)^  SHUFFLER = \{.*?^  NOBODY = [^\n]*\n", "", text)
        text, defaults = re.subn(r"(?m)^  default_permissions: [^\n]*\n", "", text)
        assert defaults == 1 and "permissions" not in text
    conf = root / "nats.conf"
    conf.write_text(text)
    return conf


@pytest.fixture(params=[True, False], ids=["shipped-acl", "no-acl-control"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[int, bool]]:
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    port = free_port()
    env = {"PATH": "/usr/bin:/bin", **PASSWORDS}
    conf = _config(tmp_path, port, request.param)
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        wait_listening(port, proc)
        yield port, request.param
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _url(port: int, user: str) -> str:
    return f"nats://{user}:{PASSWORDS[user.upper() + '_NATS_PASSWORD']}@127.0.0.1:{port}"


async def _stored(port: int) -> int:
    client = await nats.connect(_url(port, "shuffler"))
    try:
        info = await client.jetstream().stream_info(STREAM)
        return int(info.state.messages)
    finally:
        await client.close()


async def _inject(port: int, user: str) -> None:
    """Publish one message to the ingest subject as ``user`` (errors swallowed: the count tells)."""
    client = await nats.connect(_url(port, user), error_cb=_ignore)
    try:
        await client.publish(SUBJECT, b"forged batch")
        await client.flush(timeout=5)
        await asyncio.sleep(0.2)  # a permissions violation arrives asynchronously
    finally:
        await client.close()


async def _ignore(_: Exception) -> None:
    return None


async def test_only_the_shufflers_user_publishes_to_the_ingest_subject(server: tuple[int, bool]) -> None:
    port, acl = server
    client, _ = await jetstream.connect(_url(port, "shuffler"), None, insecure=True)  # as the shuffler does
    await client.close()
    consumer_side, js = await jetstream.connect(_url(port, "aggregator"), None, insecure=True)
    try:  # the aggregator's user can bind the consumer it uses and fetch (nothing yet)
        subscription = await js.pull_subscribe(SUBJECT, durable=CONSUMER, config=ConsumerConfig(ack_wait=5))
        with pytest.raises(nats.errors.TimeoutError):
            await subscription.fetch(1, timeout=0.5)
        await _inject(port, "aggregator")
        assert await _stored(port) == (0 if acl else 1)  # the control: without the ACL it lands
        await _inject(port, "shuffler")
        (message,) = await subscription.fetch(1, timeout=5)
        await message.ack()  # and acknowledges what it took
        assert message.data == b"forged batch"
    finally:
        await consumer_side.close()
    with pytest.raises(Exception):  # noqa: B017 - nats-py raises several types for one refusal
        await nats.connect(
            f"nats://127.0.0.1:{port}", max_reconnect_attempts=0, connect_timeout=2, allow_reconnect=False
        )
