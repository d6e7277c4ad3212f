"""Writing certificates and private keys to disk, atomically and with the right modes.

A key file is created with mode 0600 from its first byte (never widened, then
narrowed) and moved into place with a rename, so a reader sees either the old
file or the whole new one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

PRIVATE_MODE = 0o600
"""Mode of private key files: readable and writable by their owner only."""
PUBLIC_MODE = 0o644
"""Mode of certificate files."""


def write_atomically(path: Path, data: bytes, *, mode: int) -> Path:
    """Write ``data`` to ``path`` through a temporary file beside it, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)  # the umask may have narrowed it further
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    return path


def write_private(path: Path, data: bytes) -> Path:
    """Write a private key readable by its owner only (0600)."""
    return write_atomically(path, data, mode=PRIVATE_MODE)


def write_public(path: Path, data: bytes) -> Path:
    """Write a certificate (0644)."""
    return write_atomically(path, data, mode=PUBLIC_MODE)
