"""Differential fuzzing of the shuffler's hand-written SubmitReports fast path against protobuf:
whenever ``RawSubmit.uniform`` accepts bytes, protobuf reads exactly the same reports from them."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deniable.shuffler.rawsubmit import RawSubmit
from deniable.v1 import deniable_pb2 as pb

QUICK = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
LONG = settings(max_examples=5000, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _agree(raw: bytes) -> None:
    fast = RawSubmit(raw).uniform()
    if fast is None:
        return  # the general path parses it with protobuf
    campaign_id, key_id, columns = fast
    parsed = pb.SubmitReportsRequest.FromString(raw)  # must parse: the fast path accepted it
    assert [(r.campaign_id, r.key_id, r.ciphertext) for r in parsed.reports] == [
        (campaign_id, key_id, c) for c in columns.ciphertexts()
    ]


_requests = st.builds(
    lambda campaign, key, width, count, seed: pb.SubmitReportsRequest(
        reports=[
            pb.EncryptedReport(campaign_id=campaign, key_id=key, ciphertext=bytes([(seed + i) % 256]) * width)
            for i in range(count)
        ]
    ).SerializeToString(),
    st.text(max_size=8),
    st.integers(0, 2**32 - 1),
    st.integers(0, 200),
    st.integers(1, 5),
    st.integers(0, 255),
)


def _mutate(raw: bytes, at: int, xor: int, cut: int) -> bytes:
    data = bytearray(raw)
    data[at % len(data)] ^= xor
    return bytes(data[: len(data) - cut])


@QUICK
@given(_requests, st.integers(0, 10_000), st.integers(0, 255), st.integers(0, 3))
def test_fast_path_agrees_with_protobuf(raw: bytes, at: int, xor: int, cut: int) -> None:
    _agree(raw)
    _agree(_mutate(raw, at, xor, cut))


@QUICK
@given(st.binary(max_size=200))
def test_fast_path_random_bytes(raw: bytes) -> None:
    _agree(raw)


@pytest.mark.slow
@LONG
@given(_requests, st.integers(0, 10_000), st.integers(0, 255), st.integers(0, 3))
def test_fast_path_agrees_long(raw: bytes, at: int, xor: int, cut: int) -> None:
    _agree(_mutate(raw, at, xor, cut))
