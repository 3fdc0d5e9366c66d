"""A fake ``Backend``: fixed answers, and a record of the actions called (no services)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deniable.admin.campaigns import CampaignSpec
from deniable.v1 import deniable_pb2 as pb


def _answer(simultaneous: bool) -> pb.QueryResponse:
    widen = 1.4 if simultaneous else 1.0
    buckets = [
        pb.BucketEstimate(
            label=label,
            raw_count=raw,
            estimate=est,
            std_error=se,
            ci_low=est - 1.96 * se * widen,
            ci_high=est + 1.96 * se * widen,
        )
        for label, raw, est, se in (
            ("red", 410, 398.25, 21.5),
            ("green", 300, 310.75, 20.25),
            ("blue", 290, 291.0, 19.75),
        )
    ]
    privacy = pb.PrivacyStatement(
        epsilon0=2.0,
        central_epsilon=0.31,
        delta=1e-6,
        analysis="feldman-mcmillan-talwar",
        amplified=True,
        smallest_batch=1000,
        local_guarantee=True,
        batch_target=1000,
        batches=1,
    )
    return pb.QueryResponse(
        campaign_id="colours",
        mechanism=pb.GRR,
        n=1000,
        buckets=buckets,
        privacy=privacy,
        confidence=0.95,
        simultaneous=simultaneous,
        manipulation=pb.ManipulationBudget(
            fake_reports=10,
            rule="1% of counted",
            computed=True,
            max_raise=[12.0, 12.0, 12.0],
            max_lower=[3.0, 3.0, 3.0],
        ),
    )


@dataclass
class FakeBackend:
    """Answers like an aggregator with one open categorical campaign ``colours``."""

    calls: list[tuple[str, Any]] = field(default_factory=list)
    closed: bool = False

    def _campaign(self) -> pb.Campaign:
        return pb.Campaign(
            id="colours",
            question="Favourite <colour>?",
            kind=pb.CATEGORICAL,
            labels=["red", "green", "blue"],
            mechanism=pb.GRR,
            epsilon0=2.0,
            n_min=100,
            key_id=1,
            hpke_suite="x25519",
            closed=self.closed,
        )

    async def status(self) -> dict[str, Any]:
        return {
            "aggregator": {"address": "x", "version": "0", "now_unix": 0},
            "campaigns": [
                {
                    "id": "colours",
                    "question": "Favourite <colour>?",
                    "mechanism": "grr",
                    "n_min": 100,
                    "batch_target": 1000,
                    "window_end_unix": None,
                    "closed": self.closed,
                    "counted": 1000,
                    "batches": 1,
                    "smallest_batch": 1000,
                    "last_batch_unix": 1_800_000_000,
                    "rejected": {"bad_padding": 2},
                    "key_id": 1,
                    "held_at_shufflers": {"pending": 7, "in_flight": 0},
                }
            ],
            "keys": [],
            "shufflers": [{"address": "s", "campaigns": []}],
        }

    async def campaigns(self) -> list[pb.Campaign]:
        return [self._campaign()]

    async def campaign(self, campaign_id: str) -> pb.Campaign:
        if campaign_id != "colours":
            raise LookupError(f"no campaign {campaign_id}")
        return self._campaign()

    async def estimate(self, campaign_id: str, binary: bool, simultaneous: bool) -> pb.QueryResponse:
        return _answer(simultaneous)

    async def keys(self) -> pb.ListKeysResponse:
        return pb.ListKeysResponse(
            keys=[
                pb.KeyInfo(
                    key_id=1,
                    public_key=b"\x01" * 32,
                    hpke_suite="x25519",
                    active=True,
                    state="active",
                    kem="x25519",
                    campaigns=["colours"],
                )
            ],
            signing_public_key=b"\x02" * 32,
        )

    async def create(self, spec: CampaignSpec) -> pb.Campaign:
        self.calls.append(("create", spec))
        return pb.Campaign(id=spec.id, key_id=1)

    async def close(self, campaign_id: str) -> pb.Campaign:
        self.calls.append(("close", campaign_id))
        return pb.Campaign(id=campaign_id, closed=True)

    async def release(self, campaign_id: str) -> None:
        self.calls.append(("release", campaign_id))

    async def rotate(self, kem: str) -> pb.KeyInfo:
        self.calls.append(("rotate", kem))
        return pb.KeyInfo(key_id=2, kem=kem)
