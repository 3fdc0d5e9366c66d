"""Many plaintexts at once: which rows ``codec.decode`` accepts for one campaign and key, in one
numpy pass (the aggregator's packed decrypt path). Same layout and rules as ``codec``; rows this
rejects go through ``codec.decode`` for their reason, and tests check both agree on every case.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from deniable.core.ids import CAMPAIGN_ID_PATTERN, MAX_CAMPAIGN_ID_BYTES
from deniable.core.wire.codec import (
    CAMPAIGN_FIELD,
    CAMPAIGN_LENGTH_AT,
    HEADER_LENGTH,
    KEY_ID_FIELD,
    PAYLOAD_LENGTH_FIELD,
    VERSION,
    VERSION_AT,
)

Rows = npt.NDArray[np.uint8]


def big_endian(columns: Rows) -> npt.NDArray[np.int64]:
    """The unsigned big-endian integer in each row's bytes."""
    weights = 1 << (8 * np.arange(columns.shape[1] - 1, -1, -1, dtype=np.int64))
    return columns.astype(np.int64) @ weights


def payload_lengths(rows: Rows) -> npt.NDArray[np.int64]:
    """The payload length field of every row."""
    return big_endian(rows[:, PAYLOAD_LENGTH_FIELD])


def accepted_rows(rows: Rows, campaign_id: str, key_ids: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    """Rows (one plaintext each, all the campaign's length) that ``decode`` accepts and that name
    ``campaign_id`` and their row's key id: version, campaign field, payload length, zero padding."""
    count, size = rows.shape
    raw = campaign_id.encode("utf-8")
    if size < HEADER_LENGTH or not CAMPAIGN_ID_PATTERN.fullmatch(campaign_id):
        return np.zeros(count, dtype=np.bool_)
    expected = np.zeros(MAX_CAMPAIGN_ID_BYTES, dtype=np.uint8)
    expected[: len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    ends = HEADER_LENGTH + payload_lengths(rows)
    columns = np.arange(size, dtype=np.int64)
    padding_clear = ~np.any((columns[None, :] >= ends[:, None]) & (rows != 0), axis=1)
    accepted: npt.NDArray[np.bool_] = (
        (rows[:, VERSION_AT] == VERSION)
        & (big_endian(rows[:, KEY_ID_FIELD]) == key_ids.astype(np.int64))
        & (rows[:, CAMPAIGN_LENGTH_AT] == len(raw))
        & np.all(rows[:, CAMPAIGN_FIELD] == expected, axis=1)
        & (ends <= size)
        & padding_clear
    )
    return accepted
