"""Blobs: the mirror's files, stored once each under their sha256.

A blob lives at ``root/sha256/<first two hex digits>/<all 64 hex digits>``.
Importing hashes while copying into a temporary file under ``root/tmp`` (the
same filesystem), then renames it into place, so a crash never leaves a partial
blob under a final name and a reader never sees one half written. Blobs are
made read-only; importing the same bytes twice keeps the one copy.

A temporary file is held under an exclusive ``flock`` while it is written, so
:meth:`BlobStore.remove_leftovers` (run when a control plane starts) removes
exactly the files no import is writing any more, whichever process left them.
A full disk ends an import with :class:`~llmgw.errors.StorageFull` (507) and
its temporary file removed.

The source is copied, not hard-linked: a hard link would share the inode, and
an edit of the original file would silently change the blob under its digest.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from llmgw.errors import NotFound, StorageFull, ValidationFailed

CHUNK_SIZE = 1 << 20
"""Bytes read or written at a time (and a fetch's gRPC message)."""
IMPORT_CHUNK = 4 << 20
"""Bytes an import reads, hashes and writes at a time: fewer, larger steps (two in memory at most)."""

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

    def path_for(self, sha256: str) -> Path:
        """Where the blob is kept once whole (it may not be there yet): a pull writes it there."""
        return self._location(sha256)

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
        with self._partial() as (temporary, target), path.open("rb") as source:
            digest = hashlib.sha256()
            size = 0
            total = os.fstat(source.fileno()).st_size
            if progress is not None:
                progress(0, total)
            # each chunk is hashed here while a thread writes it (both let go of the GIL): the import
            # takes about as long as the slower of the two, not their sum; two chunks in memory at most
            with ThreadPoolExecutor(1, thread_name_prefix="blob-write") as writer:
                written: Future[None] | None = None
                while chunk := source.read(IMPORT_CHUNK):
                    if written is not None:
                        written.result()
                    written = writer.submit(self._write, target, chunk)
                    digest.update(chunk)
                    size += len(chunk)
                    if progress is not None:
                        progress(size, max(total, size))
                if written is not None:
                    written.result()
            return self._keep(temporary, target, digest.hexdigest(), size, path.name)

    async def import_stream(
        self, chunks: AsyncIterable[bytes], filename: str, *, max_bytes: int | None = None
    ) -> BlobInfo:
        """Store bytes as they arrive (an upload), hashing on the way; nothing is buffered whole.

        More than ``max_bytes`` ends the import with ValidationFailed; a full disk with StorageFull.
        """
        with self._partial() as (temporary, target):
            digest = hashlib.sha256()
            size = 0
            async for chunk in chunks:
                if not chunk:
                    continue
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise ValidationFailed(
                        [("body", f"the upload passed the mirror's limit of {max_bytes} bytes")],
                        hint="import files this large on the control plane itself with 'llmgw mirror import'",
                    )
                digest.update(chunk)
                await asyncio.to_thread(self._write, target, chunk)
            return await asyncio.to_thread(self._keep, temporary, target, digest.hexdigest(), size, filename)

    async def adopt(self, path: Path, sha256: str, filename: str) -> BlobInfo:
        """Move a file already checked to hash to ``sha256`` (on the store's disk) in as that blob."""
        return await asyncio.to_thread(self._adopt_blocking, path, normalize_sha256(sha256), filename)

    def _adopt_blocking(self, path: Path, sha256: str, filename: str) -> BlobInfo:
        with path.open("rb") as source:
            os.fsync(source.fileno())
            size = os.fstat(source.fileno()).st_size
        final = self._location(sha256)
        if final.is_file() and final.stat().st_size == size:
            path.unlink()
            return BlobInfo(sha256, size, filename)
        final.parent.mkdir(parents=True, exist_ok=True)
        path.chmod(0o444)
        os.replace(path, final)
        fsync_directory(final.parent)
        return BlobInfo(sha256, size, filename)

    @contextlib.contextmanager
    def _partial(self) -> Iterator[tuple[Path, BinaryIO]]:
        """A new temporary file under ``tmp``, locked while written, removed unless kept."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        temporary = self._tmp / f"{uuid.uuid4().hex}.partial"
        try:
            with temporary.open("wb") as target:
                fcntl.flock(target.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                yield temporary, target
        except OSError as error:
            self._raise_if_full(error)
            raise
        finally:
            temporary.unlink(missing_ok=True)

    def _write(self, target: BinaryIO, chunk: bytes) -> None:
        try:
            target.write(chunk)
        except OSError as error:
            self._raise_if_full(error)
            raise

    def _raise_if_full(self, error: OSError) -> None:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT):
            return
        free = shutil.disk_usage(self.root).free if self.root.exists() else 0
        raise StorageFull(
            f"the mirror's disk at {self.root} is full ({free} bytes free); nothing of this file was kept",
            hint="free space there, or move the control plane's data_dir to a larger disk, then import again",
        ) from error

    def _keep(self, temporary: Path, target: BinaryIO, sha256: str, size: int, filename: str) -> BlobInfo:
        """Move a whole, synced temporary file into place under its digest (blocking)."""
        try:
            target.flush()
            os.fsync(target.fileno())
        except OSError as error:
            self._raise_if_full(error)
            raise
        final = self._location(sha256)
        if final.is_file() and final.stat().st_size == size:
            return BlobInfo(sha256, size, filename)
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary.chmod(0o444)
        os.replace(temporary, final)
        fsync_directory(final.parent)
        return BlobInfo(sha256, size, filename)

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

    def remove(self, sha256: str) -> bool:
        """Delete the blob's file (a reader that has it open reads on); whether there was one."""
        try:
            self._location(normalize_sha256(sha256)).unlink()
        except FileNotFoundError:
            return False
        return True

    def remove_leftovers(self) -> int:
        """Delete the temporary files interrupted imports left behind; how many went.

        A file an import is still writing (in any process) is locked and stays.
        Uploads of older versions (``.upload-*`` in the root) go too.
        """
        leftovers = [*self._tmp.glob("*.partial"), *self.root.glob(".upload-*")] if self.root.is_dir() else []
        removed = 0
        for leftover in leftovers:
            try:
                with leftover.open("rb") as handle:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    leftover.unlink()
                removed += 1
            except (BlockingIOError, FileNotFoundError):
                continue
        return removed
