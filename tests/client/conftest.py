"""Shared fixtures for the client SDK tests: real aggregator keys and campaigns built from them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deniable.client.outbox import Outbox
from deniable.core import mechanisms
from deniable.core.campaigns import BINARY_LABELS, layout_for
from deniable.core.crypto import SUITE_NAME, KeyPair, SigningKey
from deniable.v1 import deniable_pb2 as pb

CampaignFactory = Callable[..., pb.Campaign]


@pytest.fixture
def key_pair() -> KeyPair:
    """A fresh aggregator key pair with key id 1."""
    return KeyPair.generate(1)


@pytest.fixture
def signing_key() -> SigningKey:
    """A fresh aggregator signing key: make_campaign signs with it, apps pin its public half."""
    return SigningKey.generate()


@pytest.fixture
def make_campaign(key_pair: KeyPair, signing_key: SigningKey) -> CampaignFactory:
    """Build a consistent campaign (GRR over 8 labels or binary RR) signed by ``signing_key``;
    keyword overrides win."""

    def build(
        campaign_id: str = "c1", mechanism: str = "grr", domain_size: int = 8, **overrides: Any
    ) -> pb.Campaign:
        randomiser = mechanisms.create(mechanism, epsilon0=1.0, domain_size=domain_size)
        layout = layout_for(randomiser)
        binary = mechanism == "binary_rr"
        fields: dict[str, Any] = dict(
            id=campaign_id,
            question="which one?",
            kind=pb.BINARY if binary else pb.CATEGORICAL,
            labels=list(BINARY_LABELS) if binary else [f"label{i}" for i in range(domain_size)],
            mechanism=pb.BINARY_RR if binary else pb.GRR,
            epsilon0=1.0,
            delta=1e-6,
            n_min=10,
            key_id=key_pair.key_id,
            public_key=key_pair.public.raw,
            hpke_suite=SUITE_NAME,
            payload_length=layout.payload_length,
            plaintext_length=layout.plaintext_length,
            ciphertext_length=layout.ciphertext_length,
            device_budget_epsilon=1.0,
        )
        fields.update(overrides)
        return signing_key.sign_campaign(pb.Campaign(**fields))

    return build


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    """An outbox in a temporary directory, closed after the test."""
    box = Outbox(tmp_path / "outbox.db")
    yield box
    box.close()


class SleepRecorder:
    """An injected sleep that returns at once and remembers the delays asked for."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


@pytest.fixture
def sleeps() -> SleepRecorder:
    """A fresh SleepRecorder."""
    return SleepRecorder()
