"""Campaign rules shared by every side: id syntax, labels, and the sizes of a report.

The shuffler uses only ``ciphertext_length``/``key_id`` from the proto; the randomiser-related
helpers here are for the client and the aggregator.
"""

from __future__ import annotations

from dataclasses import dataclass

from deniable.core import mechanisms
from deniable.core.crypto import SUITE_NAME, ciphertext_length
from deniable.core.mechanisms import LocalRandomiser
from deniable.core.wire import plaintext_length
from deniable.v1 import deniable_pb2 as pb

BINARY_LABELS = ("no", "yes")


@dataclass(frozen=True)
class ReportLayout:
    """Sizes of every report of a campaign."""

    payload_length: int
    plaintext_length: int
    ciphertext_length: int


def layout_for(randomiser: LocalRandomiser, suite_name: str = SUITE_NAME) -> ReportLayout:
    """Payload, padded plaintext and ciphertext lengths for a randomiser sealed under ``suite_name``."""
    plain = plaintext_length(randomiser.payload_length)
    return ReportLayout(randomiser.payload_length, plain, ciphertext_length(plain, suite_name))


def randomiser_for(campaign: pb.Campaign) -> LocalRandomiser:
    """The campaign's randomiser, rebuilt from its description (same on device and aggregator)."""
    return mechanisms.create(
        mechanisms.name_for_proto(campaign.mechanism),
        epsilon0=campaign.epsilon0,
        domain_size=len(campaign.labels),
        **dict(campaign.params),
    )


def mechanism_has_local_guarantee(campaign: pb.Campaign) -> bool:
    """Whether each report of the campaign is locally epsilon0-DP on its own (from the mechanism,
    never from the description's own ``local_guarantee`` claim); False for shuffle-only protocols."""
    return mechanisms.mechanism_class(mechanisms.name_for_proto(campaign.mechanism)).local_privacy


def local_epsilon(campaign: pb.Campaign) -> float | None:
    """The local epsilon a device keeps whoever misbehaves, or None for a shuffle-only protocol."""
    return campaign.epsilon0 if mechanism_has_local_guarantee(campaign) else None
