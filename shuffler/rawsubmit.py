"""SubmitReports as it arrived: the request bytes, parsed by protobuf only when needed.

Nearly every request is a run of reports for one campaign, each encoded exactly alike except for
its ciphertext: the same element prefix (campaign id, key id, ciphertext length), then the
ciphertext. ``RawSubmit.uniform`` recognises that shape with numpy and returns the ciphertexts as
columns: no protobuf object, no Python object per report. Anything else (several campaigns,
another key id, a wrong length, any other encoding) takes ``RawSubmit.parsed`` and the usual
per-report checks, so the answer never depends on which path was taken.

``RawSubmitInterceptor`` makes the gRPC server hand SubmitReports a ``RawSubmit`` instead of
parsing the request itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
import numpy as np

from deniable.core.protowire import read_varint, report_prefix
from deniable.shuffler.columns import U32, Columns
from deniable.v1 import deniable_pb2 as pb

SUBMIT_METHOD: Final = "/deniable.v1.Shuffler/SubmitReports"


class RawSubmit:
    """A SubmitReportsRequest kept as bytes; ``reports`` parses it (once) like the real message."""

    __slots__ = ("_parsed", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._parsed: pb.SubmitReportsRequest | None = None

    @property
    def parsed(self) -> pb.SubmitReportsRequest:
        """The protobuf message (DecodeError for bytes that are not one)."""
        if self._parsed is None:
            self._parsed = pb.SubmitReportsRequest.FromString(self.raw)
        return self._parsed

    @property
    def reports(self) -> Any:
        """``parsed.reports``."""
        return self.parsed.reports

    def uniform(self) -> tuple[str, int, Columns] | None:
        """(campaign id, key id, the ciphertexts) if every report repeats the first one's campaign,
        key id and ciphertext length, canonically encoded; None otherwise (the caller then parses
        and checks report by report). Costs no look-up: the caller checks the campaign after."""
        raw = self.raw
        head = self._first_head()
        if head is None:
            return None
        campaign_id, key_id, width, prefix_length = head
        prefix = raw[:prefix_length]
        if prefix != report_prefix(campaign_id.encode("utf-8"), key_id, width, field_number=1):
            return None  # not the canonical encoding: let protobuf read it
        element = prefix_length + width
        count, rest = divmod(len(raw), element)
        if count == 0 or rest:
            return None
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(count, element)
        if not bool(np.all(rows[:, :prefix_length] == np.frombuffer(prefix, dtype=np.uint8))):
            return None
        data = np.ascontiguousarray(rows[:, prefix_length:]).reshape(-1)
        columns = Columns(np.full(count, key_id, dtype=U32), np.full(count, width, dtype=U32), data)
        return campaign_id, key_id, columns

    def _first_head(self) -> tuple[str, int, int, int] | None:
        """(campaign id, key id, ciphertext length, bytes before the ciphertext) of report 1."""
        raw = self.raw
        if len(raw) < 4 or raw[0] != 0x0A:
            return None
        outer = read_varint(raw, 1)
        if outer is None:
            return None
        inner_length, at = outer
        end = at + inner_length
        if end > len(raw) or at >= len(raw) or raw[at] != 0x0A:
            return None
        name = read_varint(raw, at + 1)
        if name is None or name[0] > 64:
            return None
        name_length, at = name
        try:
            campaign_id = raw[at : at + name_length].decode("utf-8")
        except UnicodeDecodeError:
            return None
        at += name_length
        key_id = 0
        if at < end and raw[at] == 0x10:
            key = read_varint(raw, at + 1)
            if key is None:
                return None
            key_id, at = key
        if at >= end or raw[at] != 0x1A:
            return None
        cipher = read_varint(raw, at + 1)
        if cipher is None:
            return None
        width, at = cipher
        if at + width != end or width == 0:
            return None
        return campaign_id, key_id, width, at


class RawSubmitInterceptor(grpc.aio.ServerInterceptor):
    """Hands SubmitReports its request as ``RawSubmit`` (other methods are untouched)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler_call_details.method == SUBMIT_METHOD and handler is not None:
            replace = getattr(handler, "_replace", None)  # grpc's RpcMethodHandler is a namedtuple
            if replace is not None:
                return replace(request_deserializer=RawSubmit)  # type: ignore[no-any-return]
        return handler
