"""Writing files atomically and with the right modes from their first byte.

A file is created under a temporary name beside its place with its final mode
(0600 for anything secret: keys, tokens, configuration holding a password),
written, flushed to disk and renamed into place, so a reader sees either the
old file or the whole new one, and a crash never leaves half a file or a
moment in which a secret was readable by others.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

PRIVATE_MODE = 0o600
"""Mode of files holding secrets: readable and writable by their owner only."""
PUBLIC_MODE = 0o644
"""Mode of files anyone on the machine may read (certificates)."""


def write_atomically(path: Path, data: bytes, *, mode: int) -> Path:
    """Write ``data`` to ``path`` through a temporary file beside it (fsynced), then rename."""
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
    with contextlib.suppress(OSError):  # the rename itself reaches the disk with its directory
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    return path


def write_private(path: Path, data: bytes) -> Path:
    """Write a secret readable by its owner only (0600)."""
    return write_atomically(path, data, mode=PRIVATE_MODE)


def write_public(path: Path, data: bytes) -> Path:
    """Write a file anyone may read (0644)."""
    return write_atomically(path, data, mode=PUBLIC_MODE)
