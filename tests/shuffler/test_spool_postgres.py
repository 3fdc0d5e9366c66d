"""PostgresSpool beyond the contract: several shufflers on one database, and its configuration errors."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from deniable.cli.main import main
from deniable.cli.options import spool_store_dsn
from deniable.core.errors import ConfigurationError
from deniable.core.rng import default_rng
from deniable.shuffler import spool_postgres
from deniable.shuffler.columns import parse_batch_wire
from deniable.shuffler.spool import Envelope, SpoolUnavailable
from deniable.shuffler.spool_postgres import LOCK_NAMESPACE, PostgresSpool, fetch_runs


@pytest.fixture
def dsn(postgres_server: Any) -> Iterator[str]:
    name = asyncio.run(postgres_server.create_database("spool"))
    yield postgres_server.dsn(name)
    asyncio.run(postgres_server.drop_database(name))


def reports(count: int, start: int) -> list[Envelope]:
    return [Envelope("a", 1, b"r-%06d" % (start + i)) for i in range(count)]


def test_two_shufflers_never_share_a_report_and_never_form_a_short_batch(dsn: str) -> None:
    """Two spools (two shufflers) append and form batches of exactly 30 at once, 4 threads each."""
    spools = [PostgresSpool(dsn), PostgresSpool(dsn)]
    batches: list[tuple[str, int]] = []
    lock = threading.Lock()

    def shuffler(index: int) -> None:
        spool = spools[index % 2]
        for round_ in range(10):
            spool.append(reports(7, 1000 * index + 7 * round_))
            for formed in spool.form_batch_sizes("a", [30], default_rng().permutation):
                with lock:
                    batches.append((formed.batch_id, formed.report_count))

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(shuffler, range(4)))
        seen: Counter[bytes] = Counter()
        for batch_id, size in batches:
            assert size == 30
            record = spools[0].load_batch(batch_id)
            assert record is not None and len(record.reports) == 30
            seen.update(r.ciphertext for r in record.reports)
        assert max(seen.values()) == 1  # no report in two batches
        assert sum(seen.values()) + spools[1].pending_count("a") == 4 * 10 * 7  # and none lost
        assert spools[1].pending_count("a") < 30
    finally:
        for spool in spools:
            spool.close()


def test_forming_waits_for_the_campaigns_advisory_lock(dsn: str) -> None:
    """Another session holding campaign a's lock holds back a's batches (not b's) until it lets go."""

    async def hold(release: threading.Event, held: threading.Event) -> None:
        db = await asyncpg.connect(dsn)
        try:
            await db.execute("SELECT pg_advisory_lock($1, hashtext('a'))", LOCK_NAMESPACE)
            held.set()
            await asyncio.to_thread(release.wait)
            await db.execute("SELECT pg_advisory_unlock($1, hashtext('a'))", LOCK_NAMESPACE)
        finally:
            await db.close()

    spool = PostgresSpool(dsn)
    release, held = threading.Event(), threading.Event()
    holder = threading.Thread(target=lambda: asyncio.run(hold(release, held)))
    holder.start()
    try:
        spool.append([*reports(3, 0), Envelope("b", 1, b"b-1")])
        assert held.wait(30)
        with ThreadPoolExecutor(max_workers=1) as pool:
            waiting = pool.submit(spool.form_batch, "a", 10, default_rng().permutation)
            assert spool.form_batch("b", 10, default_rng().permutation) is not None
            assert not waiting.done() and spool.pending_count("a") == 3
            release.set()
            assert waiting.result(timeout=30) is not None
        assert spool.pending_count("a") == 0
    finally:
        release.set()
        holder.join()
        spool.close()


def test_a_segment_committed_late_with_a_lower_number_is_not_lost(dsn: str) -> None:
    """Sequence numbers are handed out before commit: a batch must remove the rows it read, not a range."""

    async def scenario() -> int:
        spool = PostgresSpool(dsn)
        late = await asyncpg.connect(dsn)
        try:
            tx = late.transaction()
            await tx.start()
            await late.execute(
                "INSERT INTO shuffler_pending (campaign_id, report_count, key_ids, lengths, ciphertexts)"
                " VALUES ('a', 1, $1, $2, $3)",
                (1).to_bytes(4, "little"),
                (5).to_bytes(4, "little"),
                b"late!",
            )
            await asyncio.to_thread(spool.append, reports(4, 0))  # a higher number, committed first
            formed = await asyncio.to_thread(spool.form_batch, "a", 10, default_rng().permutation)
            assert formed is not None and len(formed.reports) == 4
            await tx.commit()
            return await asyncio.to_thread(spool.pending_count, "a")
        finally:
            await late.close()
            spool.close()

    assert asyncio.run(scenario()) == 1


def test_wire_bytes_parse_back(dsn: str) -> None:
    spool = PostgresSpool(dsn)
    try:
        spool.append(reports(5, 0))
        (formed,) = spool.form_batch_sizes("a", [5], default_rng().permutation)
        wire = spool.load_wire(formed.batch_id)
        assert wire is not None and wire[1] == 5
        assert parse_batch_wire(wire[0]) == spool.load_batch(formed.batch_id)
    finally:
        spool.close()


def test_bad_dsns_are_one_line_errors_without_the_password(postgres_server: Any) -> None:
    with pytest.raises(ConfigurationError, match="postgresql:// DSN"):
        PostgresSpool("/var/lib/spool.sqlite3")
    wrong = f"postgresql://postgres:hunter2@127.0.0.1:{postgres_server.port}/postgres"
    with pytest.raises(ConfigurationError) as caught:
        PostgresSpool(wrong, timeout_s=5)
    assert "hunter2" not in str(caught.value) and "\n" not in str(caught.value)
    assert "cannot use spool store postgresql://postgres@127.0.0.1" in str(caught.value)


def test_a_database_gone_is_spool_unavailable_like_a_full_disk(postgres_server: Any) -> None:
    """The handlers turn OSError into UNAVAILABLE (nothing acknowledged); health pings fail too."""
    name = asyncio.run(postgres_server.create_database("gone"))
    spool = PostgresSpool(postgres_server.dsn(name))
    try:
        spool.append(reports(2, 0))
        asyncio.run(postgres_server.drop_database(name))  # ends the pool's sessions
        with pytest.raises(SpoolUnavailable) as caught:
            spool.append(reports(2, 2))
        assert isinstance(caught.value, OSError) and postgres_server.password not in str(caught.value)
        with pytest.raises(OSError):
            spool.ping()
    finally:
        spool.close()


def test_whole_requests_stay_in_one_release_and_a_stale_plan_forms_nothing(dsn: str) -> None:
    """Multi-message campaigns: a release ends on a request boundary and is ONE permutation cut into
    chunks (ADR 0023; before, each batch was permuted on its own and ended on a boundary); a plan
    whose total no longer ends on a boundary (another shuffler moved requests) forms nothing."""
    spool = PostgresSpool(dsn)
    try:
        first, second = reports(3, 0), reports(4, 3)
        spool.append(first)
        spool.append(second)
        assert spool.pending_segment_counts("a") == [3, 4]
        assert spool.form_batch_sizes("a", [2, 3], default_rng().permutation, whole=True) == []
        assert spool.pending_count("a") == 7
        one, two = spool.form_batch_sizes("a", [4, 3], default_rng().permutation, whole=True)
        loaded = [spool.load_batch(b.batch_id) for b in (one, two)]
        assert loaded[0] is not None and loaded[1] is not None
        every = sorted(r.ciphertext for b in loaded if b is not None for r in b.reports)
        assert every == sorted(e.ciphertext for e in [*first, *second])
        assert loaded[0].release_id == loaded[1].release_id != ""
        assert [(b.chunk_index, b.chunk_count, b.release_messages) for b in loaded if b is not None] == [
            (0, 2, 7),
            (1, 2, 7),
        ]
    finally:
        spool.close()


def test_serve_with_a_bad_spool_store_is_one_line_exit_2_without_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "shuf"
    argv = ["shuffler", "serve", "--data-dir", str(data), "--insecure", "--listen", "127.0.0.1:0"]
    assert main([*argv, "--spool-store", "postgresql://u:secretpw@127.0.0.1:1/db"]) == 2
    monkeypatch.setenv("DENIABLE_SPOOL_STORE", "mysql://u:secretpw@h/db")
    assert main(argv) == 2  # without --spool-store: from the environment
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("{")]
    assert len(lines) == 2 and all("secretpw" not in line for line in lines), lines
    assert "cannot use spool store postgresql://u@127.0.0.1:1/db" in lines[0]
    assert "must be a postgresql:// DSN" in lines[1]
    assert not data.exists()  # a failed start leaves nothing behind


def test_spool_dsn_from_flag_file_or_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Like the aggregator's --store: a file or the environment keeps the password out of argv."""
    secret = tmp_path / "dsn"
    secret.write_text("postgresql://u:from-file@db/x\n")
    monkeypatch.delenv("DENIABLE_SPOOL_STORE", raising=False)
    monkeypatch.delenv("DENIABLE_SPOOL_STORE_FILE", raising=False)
    assert spool_store_dsn(None, None) is None
    assert spool_store_dsn(None, secret) == "postgresql://u:from-file@db/x"
    monkeypatch.setenv("DENIABLE_SPOOL_STORE_FILE", str(secret))
    assert spool_store_dsn(None, None) == "postgresql://u:from-file@db/x"
    monkeypatch.setenv("DENIABLE_SPOOL_STORE", "postgresql://u:from-env@db/x")
    assert spool_store_dsn(None, None) == "postgresql://u:from-env@db/x"
    assert spool_store_dsn("postgresql://flag@db/x", secret) == "postgresql://flag@db/x"
    with pytest.raises(ConfigurationError, match="cannot read the secret file"):
        spool_store_dsn(None, tmp_path / "missing")


def test_fetch_runs_cut_the_segments_into_bounded_runs_in_order() -> None:
    heads = [(1, 25), (2, 25), (3, 10), (4, 90), (5, 5), (6, 50)]
    assert fetch_runs(heads, 50) == [[1, 2], [3], [4], [5], [6]]
    assert fetch_runs(heads, 1000) == [[1, 2, 3, 4, 5, 6]]
    assert fetch_runs([], 50) == []


def test_a_release_is_read_a_bounded_run_at_a_time(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round trip that reads pending segments while a release is formed brings at most
    REPORTS_PER_FETCH reports (here 50: two requests of 25), never the release (500)."""
    runs: list[list[int]] = []

    def recording(heads: list[tuple[int, int]], limit: int) -> list[list[int]]:
        cut = fetch_runs(heads, limit)
        runs.extend(cut)
        return cut

    monkeypatch.setattr(spool_postgres, "REPORTS_PER_FETCH", 50)
    monkeypatch.setattr(spool_postgres, "fetch_runs", recording)
    spool = PostgresSpool(dsn)
    try:
        for i in range(20):
            spool.append(reports(25, 25 * i))
        formed = spool.form_batch_sizes("a", [100] * 5, default_rng().permutation, whole=True)
        assert [b.report_count for b in formed] == [100] * 5
        assert len(runs) == 5 * 10 and all(len(run) == 2 for run in runs)  # 5 passes, 10 runs each
        got = sorted(
            r.ciphertext for b in formed for r in (spool.load_batch(b.batch_id) or pytest.fail()).reports
        )
        assert got == sorted(e.ciphertext for e in reports(500, 0))
    finally:
        spool.close()
