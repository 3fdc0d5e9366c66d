"""Release accounting (ADR 0023): a release's chunks are held apart until all are committed.

A shuffler cuts one permutation into chunks that fit the byte limit. The aggregator keeps each
release's counts aside until every chunk is in and the chunks add up to the release total it
claimed; only then are they added to the campaign and the release's size enters the statement.
A shuffler that claims a huge release therefore states nothing it has not delivered in full.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from deniable.core.batches import ReleaseChunk

ReleaseCheck = Callable[[Sequence[int], int], "str | None"]
"""(a complete release's count cells, messages counted) -> why it is refused, or None."""


class ReleaseConflict(Exception):
    """A chunk disagrees with its release, or a complete release is refused (FAILED_PRECONDITION)."""


@dataclass
class ReleaseState:
    """A release's chunks so far: claimed totals, chunks seen, messages, counted and count cells."""

    chunk_count: int
    messages: int
    chunks: list[int] = field(default_factory=list)
    size: int = 0
    counted: int = 0
    counts: list[int] = field(default_factory=list)

    def dumps(self) -> str:
        """The state as stored (JSON text)."""
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> ReleaseState:
        """The stored state."""
        return cls(**json.loads(text))

    def add(self, chunk: ReleaseChunk, tally: Sequence[int], counted: int, size: int) -> bool:
        """Add one chunk; True once every chunk is in. ReleaseConflict if it disagrees."""
        if (chunk.count, chunk.messages) != (self.chunk_count, self.messages):
            raise ReleaseConflict(
                f"release {chunk.release_id[:80]!r}: chunk claims {chunk.count} chunks and"
                f" {chunk.messages} messages, earlier chunks {self.chunk_count} and {self.messages}"
            )
        if chunk.index in self.chunks:
            raise ReleaseConflict(f"release {chunk.release_id[:80]!r}: chunk {chunk.index} came twice")
        self.chunks.append(chunk.index)
        self.size += size
        self.counted += counted
        self.counts = [a + int(b) for a, b in zip(self.counts or [0] * len(tally), tally, strict=True)]
        if self.size > self.messages:
            raise ReleaseConflict(f"release {chunk.release_id[:80]!r}: chunks exceed the claimed total")
        if len(self.chunks) < self.chunk_count:
            return False
        if self.size != self.messages:
            raise ReleaseConflict(
                f"release {chunk.release_id[:80]!r}: its chunks hold {self.size} messages, not the"
                f" {self.messages} claimed"
            )
        return True
