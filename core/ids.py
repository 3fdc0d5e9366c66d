"""The campaign-id rule, once, for every side (the shuffler included: this module imports nothing).

Lower-case letters, digits, '.', '_' and '-', 1 to 63 characters, starting alphanumeric: safe as an
MQTT topic level (no wildcard), a file name and a label, and within the plaintext's 64-byte field.
"""

from __future__ import annotations

import re
from typing import Final

CAMPAIGN_ID_PATTERN: Final = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
MAX_CAMPAIGN_ID_BYTES: Final = 64
"""The plaintext's campaign-id field; every valid id fits with room to spare."""


def valid_campaign_id(campaign_id: str) -> bool:
    """Whether ``campaign_id`` follows the rule."""
    return CAMPAIGN_ID_PATTERN.fullmatch(campaign_id) is not None
