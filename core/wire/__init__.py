"""Fixed-length plaintext codec for one report."""

from deniable.core.ids import MAX_CAMPAIGN_ID_BYTES
from deniable.core.wire.codec import (
    HEADER_LENGTH,
    REPORT_ID_LENGTH,
    MalformedPlaintext,
    Plaintext,
    decode,
    encode,
    new_report_id,
    plaintext_length,
)

__all__ = [
    "HEADER_LENGTH",
    "MAX_CAMPAIGN_ID_BYTES",
    "REPORT_ID_LENGTH",
    "MalformedPlaintext",
    "Plaintext",
    "decode",
    "encode",
    "new_report_id",
    "plaintext_length",
]
