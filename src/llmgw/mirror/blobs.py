"""Blobs: the mirror's files, stored once each under their sha256.

A blob lives at ``root/sha256/<first two hex digits>/<all 64 hex digits>``.
Importing hashes while copying into a temporary file under ``root/tmp`` (the
same filesystem), then renames it into place, so a crash never leaves a partial
blob under a final name and a reader never sees one half written. Blobs are
made read-only; importing the same bytes twice keeps the one copy.

The source is copied, not hard-linked: a hard link would share the inode, and
an edit of the original file would silently change the blob under its digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from llmgw.errors import NotFound, ValidationFailed

CHUNK_SIZE = 1 << 20
"""Bytes read or written at a time."""

_SHA256 = re.compile(r"[0-9a-f]{64}")

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes in all) as a copy goes on."""


def normalize_sha256(value: str) -> str:
    """``value`` as 64 lower-case hex digits (a ``sha256:`` prefix is dropped)."""
    digest = value.strip().lower().removeprefix("sha256:")
    if not _SHA256.fullmatch(digest):
        raise ValidationFailed(
            [("sha256", f"{value!r} is not a sha256 digest")],
            hint="give the 64 hex digits sha256sum prints, optionally prefixed with 'sha256:'",
        )
    return digest


def hash_file(path: Path, chunk_size: int = CHUNK_SIZE) -> tuple[str, int]:
    """(sha256 hex digest, size in bytes) of a file; blocking."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as source:
        while chunk := source.read(chunk_size):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` survive a power cut (best effort)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


@dataclass(frozen=True)
class BlobInfo:
    """A blob as imported: its digest, size and the name of the file it came from."""

    sha256: str
    size: int
    filename: str


class BlobStore:
    """Content-addressed files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def _tmp(self) -> Path:
        return self.root / "tmp"

    def _location(self, sha256: str) -> Path:
        digest = normalize_sha256(sha256)
        return self.root / "sha256" / digest[:2] / digest

    def has(self, sha256: str) -> bool:
        """Whether the blob is in the store."""
        return self._location(sha256).is_file()

    def path_of(self, sha256: str) -> Path:
        """Where the blob is; NotFound when it is not in the store."""
        path = self._location(sha256)
        if not path.is_file():
            raise NotFound(
                f"no blob sha256:{normalize_sha256(sha256)} in the mirror at {self.root}",
                hint="import it with llmgw mirror import FILE",
            )
        return path

    def verify(self, sha256: str) -> bool:
        """Whether the blob's bytes still hash to its name; blocking (use a thread in async code)."""
        path = self.path_of(sha256)
        actual, _ = hash_file(path)
        return actual == normalize_sha256(sha256)

    async def import_file(self, path: Path, *, progress: Progress | None = None) -> BlobInfo:
        """Copy a file into the store under its sha256; importing it again changes nothing."""
        report: Progress | None = None
        if progress is not None:
            loop = asyncio.get_running_loop()
            callback = progress

            def report(done: int, total: int) -> None:
                loop.call_soon_threadsafe(callback, done, total)

        return await asyncio.to_thread(self._import_blocking, path, report)

    def _import_blocking(self, path: Path, progress: Progress | None) -> BlobInfo:
        if not path.is_file():
            raise NotFound(
                f"cannot import {path}: no such file",
                hint="give the path of a regular file that exists on this machine",
            )
        self._tmp.mkdir(parents=True, exist_ok=True)
        temporary = self._tmp / f"{uuid.uuid4().hex}.partial"
        try:
            digest = hashlib.sha256()
            size = 0
            with path.open("rb") as source, temporary.open("wb") as target:
                total = os.fstat(source.fileno()).st_size
                if progress is not None:
                    progress(0, total)
                while chunk := source.read(CHUNK_SIZE):
                    digest.update(chunk)
                    target.write(chunk)
                    size += len(chunk)
                    if progress is not None:
                        progress(size, max(total, size))
                target.flush()
                os.fsync(target.fileno())
            sha256 = digest.hexdigest()
            final = self._location(sha256)
            if final.is_file() and final.stat().st_size == size:
                return BlobInfo(sha256, size, path.name)
            final.parent.mkdir(parents=True, exist_ok=True)
            temporary.chmod(0o444)
            os.replace(temporary, final)
            fsync_directory(final.parent)
            return BlobInfo(sha256, size, path.name)
        finally:
            temporary.unlink(missing_ok=True)

    async def read_chunks(
        self, sha256: str, offset: int = 0, chunk_size: int = CHUNK_SIZE
    ) -> AsyncIterator[bytes]:
        """The blob's bytes from ``offset`` on, ``chunk_size`` at a time."""
        path = self.path_of(sha256)
        size = path.stat().st_size
        if offset < 0 or offset > size:
            raise ValidationFailed(
                [("offset", f"{offset} is outside blob sha256:{normalize_sha256(sha256)} of {size} bytes")],
                hint="resume from an offset between 0 and the blob's size, or start again from 0",
            )
        source = await asyncio.to_thread(path.open, "rb")
        try:
            await asyncio.to_thread(source.seek, offset)
            while chunk := await asyncio.to_thread(source.read, chunk_size):
                yield chunk
        finally:
            source.close()

    def remove_leftovers(self, older_than_s: float = 3600.0) -> int:
        """Delete temporary files an interrupted import left behind; how many went.

        Only files older than ``older_than_s`` go, so an import still running
        keeps its own.
        """
        if not self._tmp.is_dir():
            return 0
        removed = 0
        cutoff = time.time() - older_than_s
        for leftover in self._tmp.glob("*.partial"):
            try:
                if leftover.stat().st_mtime < cutoff:
                    leftover.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed
