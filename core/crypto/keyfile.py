"""Private-key files: written owner-only, and accepted only owner-only or shared with a group named
by the operator.

Kubernetes' fsGroup pass makes files on a volume group-readable (0640/0660) by the pod's fsGroup;
an aggregator started with ``--key-group GID`` accepts exactly that group and nothing wider (ADR 0020).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def exposure(
    mode: int, file_gid: int, trusted_group: int | None, process_groups: frozenset[int]
) -> str | None:
    """Why a key file with ``mode`` and group ``file_gid`` is too open, or None when it is acceptable.

    World bits are always refused; group bits only when the file's group is ``trusted_group`` and the
    process itself is a member of it (the pod's fsGroup), so no other account gains access.
    """
    perms = stat.S_IMODE(mode)
    if perms & stat.S_IRWXO:
        return f"is accessible to others (mode {oct(perms)})"
    if not perms & stat.S_IRWXG:
        return None
    if trusted_group is None:
        return f"is accessible to others in its group (mode {oct(perms)}; --key-group names a trusted one)"
    if file_gid != trusted_group or trusted_group not in process_groups:
        return (
            f"is accessible to others in group {file_gid} (mode {oct(perms)}); only the process's own"
            f" key group {trusted_group} may share it"
        )
    return None


def own_groups() -> frozenset[int]:
    """The process's effective and supplementary group ids."""
    return frozenset({os.getegid(), *os.getgroups()})


def check_private_file(path: Path, what: str, trusted_group: int | None = None) -> None:
    """Raise PermissionError if ``path`` (a private key) is readable or writable beyond the rule above."""
    info = path.stat()
    problem = exposure(info.st_mode, info.st_gid, trusted_group, own_groups())
    if problem is not None:
        raise PermissionError(f"{what} {path} {problem}")


def write_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only (mode 0600, even over an older file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
