"""Putting a file of this machine into the control plane's mirror (kept by sha256).

The upload says how far it has got to a :data:`UploadProgress` callable, not
to a screen: the command line draws a bar from it, the console a line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmgw.adminapi.schemas import BlobImported
from llmgw.client.admin import AdminClient
from llmgw.errors import ValidationFailed

UploadProgress = Callable[[str, int, int], None]
"""Called with the name the file is stored under, the bytes sent so far and its size: once with 0 before
the first byte goes, then after each chunk."""


def upload_file(
    admin: AdminClient, file: Path, *, filename: str = "", progress: UploadProgress | None = None
) -> BlobImported:
    """Upload ``file`` into the mirror under ``filename`` (default: its own name); what the mirror holds
    then. A path that is no readable file is refused before anything is sent."""
    if not file.is_file():
        raise ValidationFailed(
            [("FILE", f"{file} is not a readable file")], "give the path of a weights file"
        )
    size = file.stat().st_size
    name = filename or file.name
    sent = 0

    def advanced(chunk: int) -> None:
        nonlocal sent
        sent += chunk
        if progress is not None:
            progress(name, sent, size)

    if progress is not None:
        progress(name, 0, size)
    with file.open("rb") as handle:
        return admin.upload_blob(name, handle, size, progress=advanced)
