"""Property-based stateful tests: random sequences of upload, replay, invalid, forward, dropped
response, restart, window close, garbage collection and query against the real handlers and store
(SQLite and PostgreSQL), checking after every step that

- counted == acknowledged valid reports (every report id the model saw accepted, once),
- no report is counted twice (replays, re-forwarded batches, lost acknowledgements),
- invalid reports are never counted, and nothing is counted once retention ended.

In process: "restart" closes the store and handlers and opens them again on the same data.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support.clock import Clock

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.store import AggregatorStore, SqliteAggregatorStore
from deniable.aggregator.store_postgres import PostgresAggregatorStore
from deniable.v1 import deniable_pb2 as pb

MARGIN = 1000.0
Opener = Callable[[], Coroutine[Any, Any, AggregatorStore]]


class Pipeline(RuleBasedStateMachine):
    """The aggregator side of the pipeline under random operations, with a model of what counts."""

    kit: Any = None
    new_opener: Callable[[asyncio.Runner, Path], Opener] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.tmp = tempfile.TemporaryDirectory(prefix="deniable-stateful-")
        self.dir = Path(self.tmp.name)
        assert Pipeline.new_opener is not None
        self.opener = Pipeline.new_opener(self.runner, self.dir)
        self.clock = Clock()
        self._open()
        request = self.kit.binary_request("s", n_min=1)
        self.campaign = self.runner.run(self.handlers.create_campaign(request))
        self.pending: list[pb.EncryptedReport] = []  # sealed by devices, not yet forwarded
        self.forwarded: list[pb.ShuffledBatch] = []  # batches sent (acknowledged or not)
        self.counted_ids: set[bytes] = set()  # the model: report ids that must be counted once
        self.id_of: dict[bytes, bytes] = {}  # ciphertext -> report id
        self.closed = False

    def _open(self) -> None:
        self.store = self.runner.run(self.opener())
        self.handlers = AggregatorHandlers(
            self.store,
            Keyring.load_or_create(self.dir / "data"),
            AggregatorMetrics(),
            clock=self.clock,
            retention_margin_s=MARGIN,
        )

    def _expired(self) -> bool:
        end = self.campaign.window_end_unix
        return end != 0 and end + MARGIN <= self.clock.now

    def _ingest(self, batch: pb.ShuffledBatch) -> pb.IngestBatchResponse:
        response = self.runner.run(self.handlers.ingest_batch(batch))
        assert response.counted <= len(batch.reports)
        return response

    @rule(values=st.lists(st.integers(0, 1), min_size=1, max_size=4))
    def upload(self, values: list[int]) -> None:
        """Devices seal reports (the shuffler has spooled them)."""
        for value in values:
            sealed = self.kit.seal(self.campaign, value)
            self.id_of[sealed.report.ciphertext] = sealed.report_id
            self.pending.append(sealed.report)

    @precondition(lambda self: bool(self.pending))
    @rule(drop_response=st.booleans())
    def forward(self, drop_response: bool) -> None:
        """The shuffler forwards the pending reports as one batch (the response may be lost)."""
        batch = self.kit.batch_of("s", self.pending)
        self.pending = []
        response = self._ingest(batch)
        self.forwarded.append(batch)
        fresh = {self.id_of[r.ciphertext] for r in batch.reports} - self.counted_ids
        expected = 0 if self._expired() else len(fresh)
        assert response.counted == expected
        if not self._expired():
            self.counted_ids |= fresh
        if drop_response:  # the shuffler never saw the ack: it re-forwards the same batch
            again = self._ingest(batch)
            assert again.duplicate_batch and again.counted == 0

    @precondition(lambda self: bool(self.forwarded))
    @rule(pick=st.integers(0, 10_000), same_batch=st.booleans())
    def replay(self, pick: int, same_batch: bool) -> None:
        """An attacker or a confused shuffler sends counted reports again."""
        old = self.forwarded[pick % len(self.forwarded)]
        batch = old if same_batch else self.kit.batch_of("s", list(old.reports))
        response = self._ingest(batch)
        assert response.counted == 0

    @rule(how=st.sampled_from(["flip", "key", "length", "domain"]), count=st.integers(1, 3))
    def invalid(self, how: str, count: int) -> None:
        """Broken reports in a batch of their own: never counted."""
        reports = []
        for _ in range(count):
            if how == "domain":
                reports.append(self.kit.seal(self.campaign, payload=bytes([9])).report)
                continue
            report = self.kit.seal(self.campaign, 1).report
            if how == "flip":
                report.ciphertext = bytes([report.ciphertext[0] ^ 1]) + report.ciphertext[1:]
            elif how == "key":
                report.key_id += 7
            else:
                report.ciphertext = report.ciphertext[:-1]
            reports.append(report)
        assert self._ingest(self.kit.batch_of("s", reports)).counted == 0

    @rule()
    def restart(self) -> None:
        """Stop and start again on the same data (keys, store)."""
        self.runner.run(self.store.close())
        self._open()

    @precondition(lambda self: not self.closed)
    @rule()
    def close_window(self) -> None:
        self.campaign = self.runner.run(
            self.handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id="s"))
        )
        self.closed = True

    @rule(seconds=st.sampled_from([1.0, MARGIN / 2, MARGIN]))
    def garbage_collection(self, seconds: float) -> None:
        """Time passes and the periodic collection runs."""
        self.clock.now += seconds
        removed = self.runner.run(self.handlers.collect_garbage())
        if removed:
            assert self._expired() and removed == {"s": removed["s"]}
        if self._expired():
            assert self.runner.run(self.store.report_id_count("s")) == 0

    @invariant()
    def counted_equals_acknowledged(self) -> None:
        snapshot = self.runner.run(self.store.snapshot("s", 2))
        assert snapshot.n == len(self.counted_ids) == sum(snapshot.counts)

    def teardown(self) -> None:
        self.runner.run(self.store.close())
        self.runner.close()
        self.tmp.cleanup()


STATEFUL = settings(
    max_examples=12,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
LONG = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)


def _sqlite(runner: asyncio.Runner, directory: Path) -> Opener:
    async def open_store() -> AggregatorStore:
        return SqliteAggregatorStore(directory / "aggregator.sqlite3")

    return open_store


def _postgres(server: Any) -> Callable[[asyncio.Runner, Path], Opener]:
    def new(runner: asyncio.Runner, directory: Path) -> Opener:
        name = runner.run(server.create_database("stateful"))  # dropped with the server's data dir

        async def open_store() -> AggregatorStore:
            return await PostgresAggregatorStore.connect(server.dsn(name), pool_size=2)

        return open_store

    return new


def _run(kit: Any, new_opener: Callable[[asyncio.Runner, Path], Opener], chosen: settings) -> None:
    Pipeline.kit, Pipeline.new_opener = kit, new_opener
    run_state_machine_as_test(Pipeline, settings=chosen)


def test_stateful_sqlite(kit: Any) -> None:
    _run(kit, _sqlite, STATEFUL)


def test_stateful_postgres(kit: Any, postgres_server: Any) -> None:
    _run(kit, _postgres(postgres_server), STATEFUL)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_stateful_long(kit: Any, request: pytest.FixtureRequest, backend: str) -> None:
    opener = _sqlite if backend == "sqlite" else _postgres(request.getfixturevalue("postgres_server"))
    _run(kit, opener, LONG)


def test_model_catches_a_double_count(kit: Any) -> None:
    """The invariant can fail: a store that forgets ids on restart lets a replay count twice."""

    class Forgetful(SqliteAggregatorStore):
        async def close(self) -> None:
            self._db.execute("DELETE FROM seen_reports")
            self._db.execute("DELETE FROM batches")
            await super().close()

    def forgetful(runner: asyncio.Runner, directory: Path) -> Opener:
        async def open_store() -> AggregatorStore:
            return Forgetful(directory / "aggregator.sqlite3")

        return open_store

    Pipeline.kit, Pipeline.new_opener = kit, forgetful
    machine = Pipeline()
    try:
        machine.upload([1, 0])
        machine.forward(drop_response=False)
        machine.restart()
        with pytest.raises(AssertionError):
            machine.replay(0, same_batch=False)
    finally:
        machine.teardown()
