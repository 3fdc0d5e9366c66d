"""ADR 0020: which private-key file modes a service accepts (owner-only, or its named fsGroup)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deniable.aggregator.keys import Keyring
from deniable.core.crypto.keyfile import exposure
from deniable.core.errors import ConfigurationError

POD = frozenset({10001})


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_owner_only_is_always_accepted(mode: int) -> None:
    assert exposure(mode, 0, None, POD) is None
    assert exposure(mode, 12345, 10001, POD) is None


@pytest.mark.parametrize("mode", [0o640, 0o660, 0o620, 0o610])
def test_group_bits_are_refused_unless_a_key_group_is_named(mode: int) -> None:
    assert "in its group" in str(exposure(mode, 10001, None, POD))


@pytest.mark.parametrize("mode", [0o640, 0o660, 0o440])
def test_the_named_group_is_accepted_when_the_process_is_in_it(mode: int) -> None:
    assert exposure(mode, 10001, 10001, POD) is None


def test_another_group_or_one_the_process_is_not_in_is_refused() -> None:
    assert "group 10002" in str(exposure(0o640, 10002, 10001, POD))
    assert exposure(0o640, 10001, 10001, frozenset({0})) is not None


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o601, 0o664, 0o777])
def test_world_bits_are_refused_even_with_a_key_group(mode: int) -> None:
    assert "accessible to others (mode" in str(exposure(mode, 10001, 10001, POD))


def test_keyring_loads_fsgroup_modes_only_with_its_own_group(tmp_path: Path) -> None:
    """The kubelet's fsGroup pass (0660, the pod's group) against a real keyring."""
    Keyring.load_or_create(tmp_path)
    group = os.getegid()
    for key in (tmp_path / "keys").glob("*.key"):
        os.chown(key, -1, group)
        key.chmod(0o660)
    with pytest.raises(ConfigurationError, match="in its group"):
        Keyring.load_or_create(tmp_path)
    assert Keyring.load_or_create(tmp_path, key_group=group).signing is not None
    with pytest.raises(ConfigurationError, match="only the process's own key group"):
        Keyring.load_or_create(tmp_path, key_group=group + 1 if group + 1 not in os.getgroups() else 65534)
