"""The segment layout both spools store: reports as columns, and batches as ``ShuffledBatch`` bytes.

A *segment* is the reports of one campaign from one SubmitReports request (pending) or one whole
permuted batch, kept as three column blobs (uint32 key ids, uint32 lengths, ciphertexts back to
back). Permuting, slicing, hashing and serialising work on these columns with numpy, so no
protobuf object or envelope is built per report. Pure: no storage here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, overload

import numpy as np
import numpy.typing as npt

from deniable.core.batches import ReleaseChunk, batch_digest, rows_digest
from deniable.core.protowire import length_delimited, report_prefix
from deniable.shuffler.spool import BatchRecord, Envelope, Permutation, new_batch_id
from deniable.v1 import deniable_pb2 as pb

U32: Final = np.dtype("<u4")
BATCH_REPORTS_FIELD: Final = 3  # ShuffledBatch.reports

Bytes = npt.NDArray[np.uint8]


class CorruptSegment(ValueError):
    """A stored segment whose blobs do not describe whole reports (damaged spool file)."""


@dataclass
class Columns:
    """Reports of one campaign as columns: key ids, lengths, and the ciphertexts back to back.

    ``data`` is a uint8 array (often a view of a stored blob), so permuting, slicing, hashing and
    storing copy the ciphertexts as few times as possible.
    """

    key_ids: npt.NDArray[np.uint32]
    lengths: npt.NDArray[np.uint32]
    data: Bytes

    @property
    def count(self) -> int:
        """Number of reports."""
        return int(self.key_ids.size)

    @classmethod
    def of(cls, key_ids: Sequence[int], ciphertexts: Sequence[bytes]) -> Columns:
        """Columns from per-report key ids and ciphertexts."""
        widths = set(map(len, ciphertexts))
        lengths = (
            np.full(len(ciphertexts), widths.pop(), dtype=U32)
            if len(widths) == 1
            else np.fromiter(map(len, ciphertexts), dtype=U32, count=len(ciphertexts))
        )
        return cls(
            np.asarray(key_ids, dtype=U32).reshape(-1),
            lengths,
            np.frombuffer(b"".join(ciphertexts), dtype=np.uint8),
        )

    @classmethod
    def load(cls, key_ids: bytes, lengths: bytes, data: bytes) -> Columns:
        """Columns over the three stored blobs (no copy); CorruptSegment if they do not fit together."""
        if len(key_ids) % 4 or len(lengths) != len(key_ids):
            raise CorruptSegment(f"segment has {len(key_ids)} bytes of key ids and {len(lengths)} of lengths")
        columns = cls(
            np.frombuffer(key_ids, dtype=U32),
            np.frombuffer(lengths, dtype=U32),
            np.frombuffer(data, dtype=np.uint8),
        )
        if int(columns.lengths.sum(dtype=np.int64)) != len(data):
            raise CorruptSegment(f"segment lengths add up to more or less than its {len(data)} bytes")
        return columns

    def width(self) -> int | None:
        """The common ciphertext length, or None if lengths differ (or there are no reports)."""
        if not self.count:
            return None
        first = int(self.lengths[0])
        return first if bool(np.all(self.lengths == first)) else None

    def ciphertexts(self) -> list[bytes]:
        """Each ciphertext as bytes."""
        width = self.width()
        data = self.data.tobytes()
        if width:  # equal, non-empty ciphertexts: fixed slices
            return [data[i : i + width] for i in range(0, width * self.count, width)]
        ends = np.cumsum(self.lengths, dtype=np.int64).tolist()
        starts = [0, *ends][:-1]  # no reports: no starts
        return [data[s:e] for s, e in zip(starts, ends, strict=True)]

    def envelopes(self, campaign_id: str) -> tuple[Envelope, ...]:
        """The reports as envelopes (for the SpoolStore interface; the fast paths avoid this)."""
        return tuple(
            Envelope(campaign_id, key, ciphertext)
            for key, ciphertext in zip(self.key_ids.tolist(), self.ciphertexts(), strict=True)
        )

    def take(self, order: npt.NDArray[np.int64]) -> Columns:
        """The reports at positions ``order``, in that order."""
        width = self.width()
        if width is not None:
            data = self.data.reshape(self.count, width)[order].reshape(-1)
        else:
            pieces = self.ciphertexts()
            data = np.frombuffer(b"".join(pieces[i] for i in order.tolist()), dtype=np.uint8)
        return Columns(self.key_ids[order], self.lengths[order], data)

    def split(self, count: int) -> tuple[Columns, Columns]:
        """The first ``count`` reports and the rest (views, no copy)."""
        cut = int(self.lengths[:count].sum(dtype=np.int64))
        return (
            Columns(self.key_ids[:count], self.lengths[:count], self.data[:cut]),
            Columns(self.key_ids[count:], self.lengths[count:], self.data[cut:]),
        )

    @staticmethod
    def concat(parts: Sequence[Columns]) -> Columns:
        """All reports of ``parts``, in order."""
        if len(parts) == 1:
            return parts[0]
        return Columns(
            np.concatenate([p.key_ids for p in parts]).astype(U32, copy=False),
            np.concatenate([p.lengths for p in parts]).astype(U32, copy=False),
            np.concatenate([p.data for p in parts]),
        )

    def digest(self) -> bytes:
        """``core.batches.batch_digest`` of the ciphertexts, in one pass when lengths are equal."""
        width = self.width()
        if width is None:
            return batch_digest(list(self.ciphertexts()))
        return rows_digest(self.data.reshape(self.count, width))

    def blobs(self) -> tuple[Bytes, Bytes, Bytes]:
        """The three blobs to store (contiguous arrays, which SQLite binds as BLOBs)."""
        return (
            np.ascontiguousarray(self.key_ids, dtype=U32).view(np.uint8),
            np.ascontiguousarray(self.lengths, dtype=U32).view(np.uint8),
            np.ascontiguousarray(self.data),
        )


class ColumnReports(Sequence[Envelope]):
    """A request's accepted reports as one ``Columns`` segment per campaign.

    It is a sequence of envelopes, so any SpoolStore can ``append`` it; ``SegmentSpool`` takes
    the columns as they are, without an envelope per report.
    """

    def __init__(self, segments: Sequence[tuple[str, Sequence[int], Sequence[bytes]]] = ()) -> None:
        """From (campaign id, key ids, ciphertexts) triples (empty ones are dropped)."""
        self.columns = [(c, Columns.of(k, t)) for c, k, t in segments if len(t)]

    @classmethod
    def of(cls, campaign_id: str, columns: Columns) -> ColumnReports:
        """One campaign's reports, already as columns."""
        made = cls()
        if columns.count:
            made.columns.append((campaign_id, columns))
        return made

    def __len__(self) -> int:
        return sum(columns.count for _, columns in self.columns)

    def __iter__(self) -> Iterator[Envelope]:
        for campaign_id, columns in self.columns:
            yield from columns.envelopes(campaign_id)

    @overload
    def __getitem__(self, index: int) -> Envelope: ...

    @overload
    def __getitem__(self, index: slice) -> list[Envelope]: ...

    def __getitem__(self, index: int | slice) -> Envelope | list[Envelope]:
        everything = list(self)
        return everything[index]


_DIGEST_FIELD_TAG: Final = bytes([4 << 3 | 2, 32])  # ShuffledBatch.digest, 32 bytes


def shuffled_batch_wire(batch_id: str, campaign_id: str, digest: bytes, columns: Columns) -> bytes:
    """The serialised ``ShuffledBatch`` for these reports (in this order), without protobuf.

    Uniform key id and length (the normal case): one prefix and one numpy copy; otherwise one
    element per report. The result parses to the same message as ``forwarder.shuffled_batch``.
    """
    wire, _ = batch_wire(batch_id, campaign_id, columns, np.arange(columns.count, dtype=np.int64), digest)
    return bytes(wire)


def release_slices(
    take: int, sizes: Sequence[int], permutation: Permutation
) -> list[tuple[npt.NDArray[np.int64], ReleaseChunk | None]]:
    """ONE permutation of ``take`` reports cut into consecutive chunks of ``sizes``, each with its
    place in the release (None when the release is a single batch, the pre-release wire form)."""
    order = checked_order(permutation(take), take)
    release_id = new_batch_id() if len(sizes) > 1 else ""
    out: list[tuple[npt.NDArray[np.int64], ReleaseChunk | None]] = []
    start = 0
    for index, size in enumerate(sizes):
        chunk = ReleaseChunk(release_id, index, len(sizes), take) if release_id else None
        out.append((order[start : start + size], chunk))
        start += size
    return out


def batch_wire(
    batch_id: str,
    campaign_id: str,
    columns: Columns,
    order: npt.NDArray[np.int64],
    digest: bytes | None = None,
    release: ReleaseChunk | None = None,
) -> tuple[bytearray, bytes]:
    """(serialised ShuffledBatch, digest) of the reports ``columns[order]``, with its release place.

    The permuted ciphertexts are copied once, straight into the message; the manifest digest is
    computed over them (``digest`` given: trusted and used as is). The digest field is written
    last: protobuf fields may come in any order, so the message is built before it is known.
    """
    campaign = campaign_id.encode("utf-8")
    head = length_delimited(1, batch_id.encode("utf-8")) + length_delimited(2, campaign)
    head += release.wire() if release is not None else b""
    width = columns.width()
    count = int(order.size)
    keys = columns.key_ids[order] if count else columns.key_ids[:0]
    if count and width is not None and bool(np.all(keys == keys[0])):
        prefix = report_prefix(campaign, int(keys[0]), width, BATCH_REPORTS_FIELD)
        element = len(prefix) + width
        wire = bytearray(len(head) + count * element + len(_DIGEST_FIELD_TAG) + 32)
        wire[: len(head)] = head
        rows = np.frombuffer(wire, dtype=np.uint8, count=count * element, offset=len(head)).reshape(
            count, element
        )
        rows[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
        np.take(
            columns.data.reshape(columns.count, width), order, axis=0, out=rows[:, len(prefix) :], mode="clip"
        )
        if digest is None:
            digest = rows_digest(rows[:, len(prefix) :])
    else:
        chunk = columns.take(order)
        digest = chunk.digest() if digest is None else digest
        parts = [head]
        for key_id, ciphertext in zip(chunk.key_ids.tolist(), chunk.ciphertexts(), strict=True):
            parts.append(report_prefix(campaign, key_id, len(ciphertext), BATCH_REPORTS_FIELD) + ciphertext)
        wire = bytearray(b"".join(parts) + bytes(len(_DIGEST_FIELD_TAG) + 32))
    if len(digest) != 32:
        raise ValueError("a batch digest is 32 bytes")
    wire[-32 - len(_DIGEST_FIELD_TAG) :] = _DIGEST_FIELD_TAG + digest
    return wire, digest


def parse_batch_wire(wire: bytes | bytearray) -> BatchRecord:
    """The batch record a stored ShuffledBatch message describes (the slow path, for the API)."""
    message = pb.ShuffledBatch.FromString(bytes(wire))
    return BatchRecord(
        batch_id=message.batch_id,
        campaign_id=message.campaign_id,
        reports=tuple(Envelope(r.campaign_id, r.key_id, r.ciphertext) for r in message.reports),
        digest=message.digest,
        release_id=message.release_id,
        chunk_index=message.chunk_index,
        chunk_count=message.chunk_count,
        release_messages=message.release_messages,
    )


def checked_order(order: npt.NDArray[np.int64] | Sequence[int], count: int) -> npt.NDArray[np.int64]:
    """The order as an int64 array; ValueError unless it is a permutation of range(count)."""
    positions = np.asarray(order, dtype=np.int64).reshape(-1)
    if positions.size != count:
        raise ValueError(f"not a permutation of range({count})")
    if count and (int(positions.min()) < 0 or int(positions.max()) >= count):
        raise ValueError(f"not a permutation of range({count})")
    if count and not bool(np.all(np.bincount(positions, minlength=count) == 1)):
        raise ValueError(f"not a permutation of range({count})")
    return positions


def segments_of(reports: Sequence[Envelope]) -> list[tuple[str, Columns]]:
    """The reports as one segment per campaign, order kept (``ColumnReports`` as they are)."""
    if isinstance(reports, ColumnReports):
        return list(reports.columns)
    by_campaign: dict[str, tuple[list[int], list[bytes]]] = {}
    for report in reports:
        keys, ciphertexts = by_campaign.setdefault(report.campaign_id, ([], []))
        keys.append(int(report.key_id))
        ciphertexts.append(bytes(report.ciphertext))
    return [(c, Columns.of(k, t)) for c, (k, t) in by_campaign.items()]
