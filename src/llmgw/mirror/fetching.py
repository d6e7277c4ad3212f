"""Fetching: writing a blob that arrives from the mirror in chunks, with resume.

The transport is the caller's (the agent's stream, HTTP); this is the file
side of it::

    writer = BlobWriter(dest, expected_sha256, expected_size)
    offset = await writer.start()              # 0, or how much an earlier try kept
    async for chunk in chunks_from(offset):
        await writer.write(chunk)
    await writer.finish()                      # checks the sha256, renames into place

Bytes go to ``dest.partial`` until ``finish`` has checked them, so ``dest``
only ever appears whole and verified. A download cut short leaves the partial
for the next try, which hashes what is there and asks for the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

from llmgw.errors import ChecksumMismatch, DownloadError
from llmgw.mirror.blobs import CHUNK_SIZE, fsync_directory, normalize_sha256

READ_AHEAD = 4
"""Chunks a fetch takes in while earlier ones are written and hashed."""


async def read_ahead(chunks: AsyncIterator[bytes], depth: int = READ_AHEAD) -> AsyncIterator[bytes]:
    """``chunks`` as they are, received up to ``depth`` ahead of the one the caller works on.

    The transport's reading (gRPC's decryption, the message's parsing) runs on
    the event loop while the caller's threads write and hash; a failure of the
    transport comes out here, after the chunks that came before it.
    """
    queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=depth)

    async def receive() -> None:
        try:
            async for chunk in chunks:
                await queue.put(chunk)
        except Exception as error:  # handed to the reader, in order
            await queue.put(error)
            return
        await queue.put(None)

    receiving = asyncio.create_task(receive(), name="read-ahead")
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        receiving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiving


class BlobWriter:
    """Writes one blob to ``dest`` through ``dest.partial``, checking size and sha256."""

    def __init__(self, dest: Path, expected_sha256: str, expected_size: int) -> None:
        self.dest = dest
        self.partial = dest.with_name(dest.name + ".partial")
        self.expected_sha256 = normalize_sha256(expected_sha256)
        self.expected_size = expected_size
        self._digest = hashlib.sha256()
        self._written = 0
        self._file: BinaryIO | None = None

    @property
    def offset(self) -> int:
        """Bytes in the partial file so far: where the next chunk belongs."""
        return self._written

    async def start(self) -> int:
        """Open the partial file, hashing what an earlier try left; the offset to fetch from.

        A partial larger than the blob cannot be part of it and is started over.
        """
        if self._file is not None:
            raise RuntimeError("BlobWriter.start called twice")
        try:
            await asyncio.to_thread(self._open_blocking)
        except OSError as error:
            raise DownloadError(
                f"cannot write {self.partial}: {error}",
                hint=f"check that {self.partial.parent} exists, is writable and has space",
            ) from error
        return self._written

    def _open_blocking(self) -> None:
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        self._digest = hashlib.sha256()
        self._written = 0
        if self.partial.is_file() and self.partial.stat().st_size <= self.expected_size:
            handle = self.partial.open("r+b")
            while chunk := handle.read(CHUNK_SIZE):
                self._digest.update(chunk)
                self._written += len(chunk)
            self._file = handle
        else:
            self._file = self.partial.open("wb")

    async def write(self, chunk: bytes) -> None:
        """Append the next chunk; DownloadError if it would run past the blob's size."""
        if self._file is None:
            raise RuntimeError("BlobWriter.write before start()")
        if self._written + len(chunk) > self.expected_size:
            await self.discard()
            raise DownloadError(
                f"{self.dest.name}: received more than the {self.expected_size} bytes expected",
                hint="the mirror sent a different file than it listed; fetch the blob again from offset 0",
            )
        # written and hashed at once, each in a thread (both let go of the GIL), off the event loop
        wrote = asyncio.ensure_future(asyncio.to_thread(self._file.write, chunk))
        try:
            await asyncio.to_thread(self._digest.update, chunk)
        finally:
            try:
                await wrote
            except OSError as error:
                raise DownloadError(
                    f"cannot write {self.partial}: {error}",
                    hint=f"free space on the disk holding {self.partial.parent} and fetch again",
                ) from error
        self._written += len(chunk)

    async def finish(self) -> Path:
        """Check size and sha256, then move the partial to ``dest``; ``dest``.

        Too few bytes: DownloadError, the partial kept for a resume. Wrong
        sha256: ChecksumMismatch, the partial removed.
        """
        if self._file is None:
            raise RuntimeError("BlobWriter.finish before start()")
        await asyncio.to_thread(self._sync_and_close)
        if self._written < self.expected_size:
            raise DownloadError(
                f"{self.dest.name}: the download ended at {self._written} of {self.expected_size} bytes",
                hint="fetch it again; the next try resumes where this one stopped",
            )
        actual = self._digest.hexdigest()
        if actual != self.expected_sha256:
            self.partial.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{self.dest.name}: expected sha256 {self.expected_sha256}, "
                f"the bytes received hash to {actual}",
                hint="the mirror's copy is damaged: re-import the file into the mirror "
                "(llmgw mirror import FILE) and fetch again",
            )
        await asyncio.to_thread(self._move_into_place)
        return self.dest

    def _sync_and_close(self) -> None:
        handle, self._file = self._file, None
        if handle is None:
            return
        try:
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            handle.close()

    def _move_into_place(self) -> None:
        os.replace(self.partial, self.dest)
        fsync_directory(self.dest.parent)

    async def close(self) -> None:
        """Stop without finishing, keeping the partial for a later resume."""
        await asyncio.to_thread(self._sync_and_close)

    async def discard(self) -> None:
        """Stop without finishing and remove the partial."""
        await self.close()
        self.partial.unlink(missing_ok=True)

    async def __aenter__(self) -> BlobWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
