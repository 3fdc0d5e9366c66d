"""``RawSubmit.uniform``: recognises exactly the requests protobuf would read as one campaign's
uniform reports, and returns the same ciphertexts; everything else is left to protobuf."""

from __future__ import annotations

import pytest

from deniable.core.rng import default_rng
from deniable.shuffler.rawsubmit import RawSubmit
from deniable.v1 import deniable_pb2 as pb


def _request(*reports: tuple[str, int, bytes]) -> bytes:
    return pb.SubmitReportsRequest(
        reports=[pb.EncryptedReport(campaign_id=c, key_id=k, ciphertext=t) for c, k, t in reports]
    ).SerializeToString()


def _agrees_with_protobuf(raw: bytes) -> None:
    shape = RawSubmit(raw).uniform()
    parsed = pb.SubmitReportsRequest.FromString(raw).reports
    assert shape is not None
    campaign_id, key_id, columns = shape
    assert [(r.campaign_id, r.key_id, r.ciphertext) for r in parsed] == [
        (campaign_id, key_id, ciphertext) for ciphertext in columns.ciphertexts()
    ]


@pytest.mark.parametrize("key_id", [0, 1, 127, 128, 300, 2**32 - 1])
@pytest.mark.parametrize("width", [1, 127, 128, 144, 1184])
def test_uniform_requests_are_read_like_protobuf(key_id: int, width: int) -> None:
    reports = [("camp-1", key_id, default_rng().bytes(width)) for _ in range(7)]
    _agrees_with_protobuf(_request(*reports))
    _agrees_with_protobuf(_request(reports[0]))


def test_a_long_campaign_id() -> None:
    _agrees_with_protobuf(_request(*[("c" * 63, 5, default_rng().bytes(144)) for _ in range(3)]))


@pytest.mark.parametrize(
    "reports",
    [
        [("a", 1, b"x" * 10), ("b", 1, b"y" * 10)],  # two campaigns
        [("a", 1, b"x" * 10), ("a", 2, b"y" * 10)],  # two key ids
        [("a", 1, b"x" * 10), ("a", 1, b"y" * 11)],  # two lengths
        [("a", 1, b"")],  # empty ciphertext
        [("", 1, b"x")],  # no campaign id
    ],
)
def test_anything_else_is_left_to_protobuf(reports: list[tuple[str, int, bytes]]) -> None:
    assert RawSubmit(_request(*reports)).uniform() is None


def test_non_canonical_or_broken_bytes_are_left_to_protobuf() -> None:
    inner = b"\x0a\x01a" + b"\x10\x00" + b"\x1a\x02xy"  # key id 0 written out explicitly
    explicit_zero = b"\x0a" + bytes([len(inner)]) + inner
    assert pb.SubmitReportsRequest.FromString(explicit_zero).reports[0].ciphertext == b"xy"
    assert RawSubmit(explicit_zero).uniform() is None
    good = _request(("a", 1, b"x" * 10), ("a", 1, b"y" * 10))
    for broken in (b"", good[:-1], good + b"\x00", b"\x12" + good[1:], good[:5]):
        assert RawSubmit(broken).uniform() is None


def test_parsed_and_reports_are_the_protobuf_message() -> None:
    raw = _request(("a", 1, b"x"), ("b", 2, b"yz"))
    request = RawSubmit(raw)
    assert request.parsed == pb.SubmitReportsRequest.FromString(raw)
    assert [r.campaign_id for r in request.reports] == ["a", "b"]
