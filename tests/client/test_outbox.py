"""Outbox: durable, transactional, per-campaign queue of sealed reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from deniable.client.outbox import Outbox
from deniable.v1 import deniable_pb2 as pb


def envelopes(campaign_id: str, count: int) -> list[pb.EncryptedReport]:
    return [
        pb.EncryptedReport(campaign_id=campaign_id, key_id=7, ciphertext=bytes([i]) * 4) for i in range(count)
    ]


def test_add_pending_remove(outbox: Outbox) -> None:
    assert outbox.add_many(envelopes("a", 3)) == 3
    assert outbox.add_many(envelopes("b", 2)) == 2
    assert outbox.add_many([]) == 0
    assert (outbox.count(), outbox.count("a"), outbox.count("b"), outbox.count("c")) == (5, 3, 2, 0)
    rows = outbox.pending(10, "a")
    assert [r.ciphertext for r in rows] == [bytes([i]) * 4 for i in range(3)]
    assert all(r.campaign_id == "a" and r.key_id == 7 and r.attempts == 0 for r in rows)
    assert rows[0].to_proto() == envelopes("a", 1)[0]
    assert len(outbox.pending(2)) == 2 and outbox.pending(0) == []
    assert outbox.remove([rows[0].id, rows[1].id, 10_000]) == 2
    assert outbox.count("a") == 1 and outbox.remove([]) == 0


def test_attempts_are_counted(outbox: Outbox) -> None:
    outbox.add_many(envelopes("a", 2))
    first, second = outbox.pending(2)
    outbox.mark_attempt([first.id])
    outbox.mark_attempt([first.id, second.id])
    assert [r.attempts for r in outbox.pending(2)] == [2, 1]


def test_survives_reopening(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as box:
        box.add_many(envelopes("a", 4))
        box.remove([box.pending(1)[0].id])
    with Outbox(tmp_path / "o.db") as box:
        assert box.count() == 3
        box.add_many(envelopes("a", 1))
        ids = [r.id for r in box.pending(10)]
        assert ids == sorted(ids) and len(set(ids)) == 4


def test_ids_are_never_reused(outbox: Outbox) -> None:
    outbox.add_many(envelopes("a", 2))
    last = outbox.pending(2)[-1].id
    outbox.remove([last])
    outbox.add_many(envelopes("a", 1))
    assert outbox.pending(2)[-1].id > last


def test_failed_transaction_adds_nothing(outbox: Outbox) -> None:
    good = envelopes("a", 2)

    def broken() -> list[pb.EncryptedReport]:
        return [*good, "not a report"]  # type: ignore[list-item]

    with pytest.raises(AttributeError):
        outbox.add_many(broken())
    assert outbox.count() == 0


def test_closed_outbox_refuses(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    box.close()
    box.close()
    with pytest.raises(RuntimeError, match="closed"):
        box.count()


def test_an_answers_messages_are_never_split_over_two_requests(tmp_path: Path) -> None:
    """``pending`` completes the last answer, so a multi-message device's messages travel in one
    request (and the shuffler keeps a request in one batch, ADR 0014)."""
    outbox = Outbox(tmp_path / "o.db")
    assert outbox.add_answers([envelopes("a", 9), envelopes("a", 9), envelopes("a", 9)]) == 27
    sizes = []
    while rows := outbox.pending(10, "a"):
        sizes.append(len(rows))
        outbox.remove([r.id for r in rows])
    assert sizes == [18, 9]  # 10 would cut the second answer: it is completed to 18
    outbox.add_many(envelopes("a", 5))  # independent reports are cut anywhere, as before
    assert len(outbox.pending(2, "a")) == 2


def test_an_outbox_from_before_answers_were_numbered_opens_and_sends_as_before(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, campaign_id TEXT NOT NULL,"
            " key_id INTEGER NOT NULL, ciphertext BLOB NOT NULL, attempts INTEGER NOT NULL DEFAULT 0)"
        )
        db.executemany(
            "INSERT INTO outbox (campaign_id, key_id, ciphertext) VALUES ('a', 1, ?)", [(b"x",)] * 3
        )
    outbox = Outbox(path)
    assert len(outbox.pending(2, "a")) == 2
    outbox.add_answers([envelopes("a", 2)])
    assert outbox.count("a") == 5
