"""How the playbooks' own modules replace a file on the host: all at once, so that a reader (sshd, sudo,
the kubelet, a service) sees the old file or the new one, never a part, also after a crash mid-write.
Shared by ``inplace_files`` (kubeadm_files), ``inplace_users`` (users) and ``inplace_service_file``."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path


def replace_file(
    path: Path, content: bytes, owner: tuple[int, int], mode: int, check: Callable[[Path], None] | None = None
) -> None:
    """Make ``path`` hold ``content``, owned by ``owner`` (uid, gid) with ``mode``: a new file beside it
    (its name starts with a dot: sudo's includedir skips it) written, synced, given to ``check`` (which
    raises to refuse it) and renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.inplace-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, content)
        os.fchown(fd, *owner)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    if check is not None:
        check(tmp)
    tmp.replace(path)
