"""Files a workflow made, kept for a while for the key that asked: ``GET /v1/files/{id}``.

A picture asked for with ``response_format: url``, and every file of a done
job, is kept here in memory and named by a random id; only the same key reads
it (any other key: 404, as for an id never given). Files are kept
``files_ttl_s`` and at most ``files_max_bytes`` in all, the oldest going
first.
"""

from __future__ import annotations

import mimetypes
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

CONTENT_TYPES = {".glb": "model/gltf-binary", ".obj": "model/obj", ".png": "image/png"}


def content_type(filename: str) -> str:
    """The media type a file is served with, by its name."""
    dot = filename.rfind(".")
    suffix = filename[dot:].lower() if dot >= 0 else ""
    return CONTENT_TYPES.get(suffix) or mimetypes.guess_type(filename)[0] or "application/octet-stream"


def content_disposition(filename: str) -> bytes:
    """A ``Content-Disposition`` header's value naming ``filename`` (RFC 6266): a plain ASCII name,
    with quotes, backslashes and anything unprintable as ``_``, and the name itself percent-encoded in
    ``filename*`` (a name kept from before names were checked can never split or end the header)."""
    plain = "".join(c if " " <= c <= "~" and c not in '"\\' else "_" for c in filename)
    encoded = quote(filename, safe="", errors="replace")
    return f"inline; filename=\"{plain}\"; filename*=UTF-8''{encoded}".encode("ascii")


@dataclass(frozen=True, slots=True)
class StoredFile:
    """One file kept for a key."""

    file_id: str
    key_id: str
    filename: str
    content_type: str
    data: bytes
    expires: float
    """When it goes (the store's clock)."""


class FileStore:
    """Files by id, each readable by one key, bounded in time and in bytes."""

    def __init__(self, ttl_s: float, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._files: OrderedDict[str, StoredFile] = OrderedDict()
        self._bytes = 0

    def put(self, key_id: str, filename: str, data: bytes) -> StoredFile:
        """Keep ``data`` for ``key_id``; the oldest files go when the store would be over its bytes."""
        self._expire()
        stored = StoredFile(
            "file-" + secrets.token_urlsafe(18),
            key_id,
            filename,
            content_type(filename),
            data,
            self._clock() + self.ttl_s,
        )
        self._files[stored.file_id] = stored
        self._bytes += len(data)
        while self._bytes > self.max_bytes and len(self._files) > 1:
            self._drop(next(iter(self._files)))
        return stored

    def get(self, file_id: str, key_id: str) -> StoredFile | None:
        """The file when ``key_id`` put it and it has not expired; None otherwise."""
        self._expire()
        stored = self._files.get(file_id)
        if stored is None or stored.key_id != key_id:
            return None
        return stored

    def __len__(self) -> int:
        return len(self._files)

    def _expire(self) -> None:
        now = self._clock()
        while self._files:
            oldest = next(iter(self._files.values()))
            if oldest.expires > now:
                return
            self._drop(oldest.file_id)

    def _drop(self, file_id: str) -> None:
        stored = self._files.pop(file_id)
        self._bytes -= len(stored.data)
