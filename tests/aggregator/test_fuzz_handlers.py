"""Fuzzing the aggregator's handlers: random and mutated-valid requests never crash a handler (only
RequestRefused, which the servicer maps to a clear status), and invalid reports never change a count.

Default run: a few dozen examples (seconds); ``pytest -m slow`` runs the larger profile.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.store import SqliteAggregatorStore
from deniable.core.errors import RequestRefused
from deniable.v1 import deniable_pb2 as pb

QUICK = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
LONG = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)

MUTATIONS = ("flip", "truncate", "extend", "key_id", "envelope_campaign", "empty")


def _mutate(report: pb.EncryptedReport, how: str, where: int, byte: int) -> pb.EncryptedReport:
    """One way of breaking a valid report so it must be rejected."""
    out = pb.EncryptedReport()
    out.CopyFrom(report)
    ct = bytearray(report.ciphertext)
    if how == "flip":
        ct[where % len(ct)] ^= byte or 1
    elif how == "truncate":
        del ct[where % len(ct) :]
    elif how == "extend":
        ct += bytes([byte]) * (1 + where % 40)
    elif how == "key_id":
        out.key_id = report.key_id + 1 + where
    elif how == "envelope_campaign":
        out.campaign_id = "other"
    elif how == "empty":
        ct = bytearray()
    out.ciphertext = bytes(ct)
    return out


class World:
    """Handlers over a real store with one binary campaign, driven from synchronous Hypothesis code."""

    def __init__(self, runner: asyncio.Runner, tmp_path: Path, kit: Any) -> None:
        self.runner, self.kit = runner, kit
        self.store = SqliteAggregatorStore(tmp_path / "fuzz.sqlite3")
        self.handlers = AggregatorHandlers(
            self.store, Keyring.load_or_create(tmp_path / "data"), AggregatorMetrics()
        )
        self.campaign = runner.run(self.handlers.create_campaign(kit.binary_request("f")))

    def n(self) -> int:
        """Reports counted so far."""
        return self.runner.run(self.store.snapshot("f", 2)).n

    def ingest(self, batch: pb.ShuffledBatch) -> pb.IngestBatchResponse | None:
        """The response, or None for a RequestRefused; anything else fails the test."""
        try:
            return self.runner.run(self.handlers.ingest_batch(batch))
        except RequestRefused:
            return None


def _check_mutated(world: World, how: str, size: int, where: int, byte: int) -> None:
    before = world.n()
    reports = [_mutate(world.kit.seal(world.campaign, 1).report, how, where, byte) for _ in range(size)]
    response = world.ingest(world.kit.batch_of("f", reports))
    assert response is None or response.counted == 0
    assert world.n() == before


def _check_random(world: World, batch: pb.ShuffledBatch) -> None:
    before = world.n()
    response = world.ingest(batch)
    assert response is None or response.counted == 0
    assert world.n() == before


_random_batches = st.builds(
    pb.ShuffledBatch,
    batch_id=st.text(max_size=20),
    campaign_id=st.sampled_from(["f", "", "nope", "F"]),
    reports=st.lists(
        st.builds(
            pb.EncryptedReport,
            campaign_id=st.sampled_from(["f", "", "x"]),
            key_id=st.integers(0, 2**32 - 1),
            ciphertext=st.binary(max_size=200),
        ),
        max_size=8,
    ),
    digest=st.binary(max_size=40),
)


def _run_mutations(settings_: settings, tmp_path: Path, kit: Any) -> None:
    with asyncio.Runner() as runner:
        world = World(runner, tmp_path, kit)
        try:

            @settings_
            @given(st.sampled_from(MUTATIONS), st.integers(1, 5), st.integers(0, 10_000), st.integers(0, 255))
            def mutated(how: str, size: int, where: int, byte: int) -> None:
                _check_mutated(world, how, size, where, byte)

            @settings_
            @given(_random_batches)
            def random(batch: pb.ShuffledBatch) -> None:
                _check_random(world, batch)

            mutated()
            random()
            # The protection is real: an unmutated batch does count (the test can fail).
            valid = [kit.seal(world.campaign, 1).report for _ in range(3)]
            response = world.ingest(kit.batch_of("f", valid))
            assert response is not None and response.counted == 3
        finally:
            runner.run(world.store.close())


def test_ingest_fuzz_never_crashes_or_counts_invalid(tmp_path: Path, kit: Any) -> None:
    _run_mutations(QUICK, tmp_path, kit)


@pytest.mark.slow
def test_ingest_fuzz_long(tmp_path: Path, kit: Any) -> None:
    _run_mutations(LONG, tmp_path, kit)


_requests = st.builds(
    pb.CreateCampaignRequest,
    id=st.one_of(st.text(max_size=70), st.from_regex(r"[a-z0-9][a-z0-9._-]{0,10}", fullmatch=True)),
    question=st.text(max_size=30),
    kind=st.integers(0, 3),
    labels=st.lists(st.text(max_size=8), max_size=6),
    epsilon0=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0.01, 5)),
    delta=st.one_of(st.floats(allow_nan=True), st.floats(1e-12, 0.1)),
    n_min=st.integers(0, 2**32 - 1),
    window_start_unix=st.integers(-(2**63), 2**63 - 1),
    window_end_unix=st.integers(-(2**63), 2**63 - 1),
)


def test_create_get_query_fuzz_never_crash(tmp_path: Path, kit: Any) -> None:
    """Random CreateCampaign, GetCampaign and query requests: a result or a RequestRefused only, and a
    created campaign can always be queried (values that would break a later query are refused)."""
    with asyncio.Runner() as runner:
        world = World(runner, tmp_path, kit)
        handlers = world.handlers

        @QUICK
        @given(_requests)
        def create(request: pb.CreateCampaignRequest) -> None:
            try:
                created = runner.run(handlers.create_campaign(request))
            except RequestRefused:
                return
            query = pb.QueryRequest(campaign_id=created.id)
            try:
                runner.run(handlers.query(query, binary=created.kind == pb.BINARY))
            except RequestRefused as exc:  # an empty campaign may be refused as such, never crash
                assert "INTERNAL" not in str(exc)

        @QUICK
        @given(st.text(max_size=100), st.booleans(), st.floats(allow_nan=True))
        def lookups(campaign_id: str, binary: bool, confidence: float) -> None:
            for call in (
                handlers.get_campaign(pb.GetCampaignRequest(campaign_id=campaign_id)),
                handlers.query(pb.QueryRequest(campaign_id=campaign_id, confidence=confidence), binary),
                handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id=campaign_id + "zz")),
            ):
                with contextlib.suppress(RequestRefused):
                    runner.run(call)

        try:
            create()
            lookups()
        finally:
            runner.run(world.store.close())
