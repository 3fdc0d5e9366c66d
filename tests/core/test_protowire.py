"""Hand-written protobuf framing equals what the protobuf runtime writes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from deniable.core.protowire import read_varint, report_element, varint
from deniable.v1 import deniable_pb2 as pb


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_varint_round_trips(value: int) -> None:
    encoded = varint(value)
    assert read_varint(encoded, 0) == (value, len(encoded))
    assert read_varint(b"\x00" + encoded, 1) == (value, len(encoded) + 1)


def test_truncated_or_overlong_varints_are_none() -> None:
    assert read_varint(b"\x80", 0) is None
    assert read_varint(b"\xff" * 5 + b"\x01", 0) is None
    assert read_varint(b"", 0) is None


@given(
    st.text(alphabet="abc-.0", min_size=0, max_size=20),
    st.integers(min_value=0, max_value=2**32 - 1),
    st.lists(st.binary(max_size=300), max_size=5),
)
def test_report_elements_are_the_runtimes_encoding(
    campaign: str, key_id: int, ciphertexts: list[bytes]
) -> None:
    reports = [pb.EncryptedReport(campaign_id=campaign, key_id=key_id, ciphertext=c) for c in ciphertexts]
    elements = b"".join(report_element(campaign.encode(), key_id, c, 1) for c in ciphertexts)
    assert elements == pb.SubmitReportsRequest(reports=reports).SerializeToString()
    batch = b"".join(report_element(campaign.encode(), key_id, c, 3) for c in ciphertexts)
    assert batch == pb.ShuffledBatch(reports=reports).SerializeToString()
