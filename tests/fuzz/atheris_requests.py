"""Coverage-guided fuzzing (atheris) of the request parsers: every request message type, the
shuffler's SubmitReports fast path (checked against protobuf), the plaintext codec and the report
opener. Seeded with valid requests written to the corpus directory on first run.

    pip install -e ".[fuzz]"
    python tests/fuzz/atheris_requests.py tests/fuzz/corpus -runs=200000   # or -max_total_time=600

A crash, an exception other than the documented ones, or a fast-path disagreement stops the run
and writes the input to crash-<hash>. Not collected by pytest (tests/fuzz/test_atheris_seeds.py
runs the same checks over the seeds in the default test run).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from google.protobuf.message import DecodeError

from deniable.aggregator.decrypt import open_reports
from deniable.core.crypto import KeyPair, PublicKey, seal_report
from deniable.core.wire import MalformedPlaintext, Plaintext, decode, encode, new_report_id
from deniable.shuffler.rawsubmit import RawSubmit
from deniable.v1 import deniable_pb2 as pb

PLAINTEXT_LENGTH = 100
PAIR = KeyPair.generate(1)
REQUEST_TYPES = [
    pb.DESCRIPTOR.message_types_by_name[method.input_type.name]
    for service in pb.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]
MESSAGES = {d.name: getattr(pb, d.name) for d in REQUEST_TYPES}


def seeds() -> list[bytes]:
    """Valid requests: a sealed SubmitReports, a batch, a campaign request, a plaintext."""
    plaintext = encode(Plaintext(new_report_id(), "c", 1, b"\x01"), PLAINTEXT_LENGTH)
    sealed = seal_report(plaintext, PublicKey(1, PAIR.public.raw), "c")
    report = pb.EncryptedReport(campaign_id="c", key_id=1, ciphertext=sealed)
    return [
        pb.SubmitReportsRequest(reports=[report, report]).SerializeToString(),
        pb.ShuffledBatch(
            batch_id="b", campaign_id="c", reports=[report], digest=b"d" * 32
        ).SerializeToString(),
        pb.CreateCampaignRequest(id="c", question="q", kind=pb.BINARY, epsilon0=1.0).SerializeToString(),
        pb.QueryRequest(campaign_id="c", confidence=0.9).SerializeToString(),
        plaintext,
    ]


def check(data: bytes) -> None:
    """One input through every parser; raises only on a real defect."""
    for message in MESSAGES.values():
        with contextlib.suppress(DecodeError):
            message.FromString(data)
    fast = RawSubmit(data).uniform()
    if fast is not None:
        campaign_id, key_id, columns = fast
        parsed = pb.SubmitReportsRequest.FromString(data)
        got = [(r.campaign_id, r.key_id, r.ciphertext) for r in parsed.reports]
        if got != [(campaign_id, key_id, c) for c in columns.ciphertexts()]:
            raise AssertionError("the SubmitReports fast path disagrees with protobuf")
    with contextlib.suppress(MalformedPlaintext):
        decode(data[:PLAINTEXT_LENGTH].ljust(PLAINTEXT_LENGTH, b"\0"), PLAINTEXT_LENGTH)
    opened = open_reports(
        "c", PLAINTEXT_LENGTH, PLAINTEXT_LENGTH + 48, {1: PAIR.private_raw}, [("c", 1, data)]
    )
    if len(opened) != 1:
        raise AssertionError("open_reports must give one outcome per envelope")


def main(argv: list[str]) -> None:
    """Write the seeds into the corpus directory (first argument) and fuzz."""
    import atheris  # type: ignore[import-untyped, import-not-found, unused-ignore]  # the optional [fuzz] extra, untyped

    corpus = Path(argv[1]) if len(argv) > 1 and not argv[1].startswith("-") else None
    if corpus is not None:
        corpus.mkdir(parents=True, exist_ok=True)
        for index, seed in enumerate(seeds()):
            (corpus / f"seed-{index}").write_bytes(seed)
    atheris.instrument_all()  # Python coverage of everything imported above (the parsers)
    atheris.Setup(argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
