"""Fuzzing the HTTPS face's one piece of request logic of its own: whatever the body, the path's
campaign check either hands the handlers a request whose every report names that campaign, or
refuses with a 400 code; it never raises anything else (docs/https.md)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deniable.shuffler.https import HttpRefusal, matching_request
from deniable.shuffler.rawsubmit import RawSubmit
from deniable.v1 import deniable_pb2 as pb

QUICK = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
PATH_CAMPAIGN = "c1"


def _check(raw: bytes) -> None:
    try:
        request = matching_request(RawSubmit(raw), PATH_CAMPAIGN)
    except HttpRefusal as refusal:
        assert refusal.status == 400 and refusal.code in ("malformed_body", "campaign_mismatch")
        return
    parsed = request.parsed if isinstance(request, RawSubmit) else request
    assert all(report.campaign_id == PATH_CAMPAIGN for report in parsed.reports)


@QUICK
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_refused_or_name_the_path_campaign(raw: bytes) -> None:
    _check(raw)


_reports = st.lists(
    st.builds(
        lambda campaign, key, width: pb.EncryptedReport(
            campaign_id=campaign, key_id=key, ciphertext=b"x" * width
        ),
        st.sampled_from([PATH_CAMPAIGN, "c2", "", "c1 "]),
        st.integers(0, 2**32 - 1),
        st.integers(0, 80),
    ),
    max_size=6,
)


@QUICK
@given(_reports, st.integers(0, 20))
def test_well_formed_requests_pass_exactly_when_every_report_names_the_path(
    reports: list[pb.EncryptedReport], cut: int
) -> None:
    raw = pb.SubmitReportsRequest(reports=reports).SerializeToString()
    every = all(r.campaign_id == PATH_CAMPAIGN for r in reports)
    try:
        matching_request(RawSubmit(raw), PATH_CAMPAIGN)
        passed = True
    except HttpRefusal:
        passed = False
    assert passed == every
    _check(raw[: max(0, len(raw) - cut)])  # and any truncation of it
