"""Downloading one file over HTTP into a partial file that survives a cut, then checking it.

A file's bytes go to ``folder/<checksum>.partial``, named by the checksum the
registry gave (so two pulls of the same file share it, and a later pull finds
what an earlier one kept). Each try asks for the rest with ``Range:
bytes=<kept>-``; a server that answers 200 instead of 206 starts the file over.
A cut connection or a timeout is tried again (``tries`` in all, waiting
``backoff_s`` doubled each time on the injected clock). Once whole, the file is
hashed and checked against the registry's checksum: a mismatch removes the
partial and raises :class:`~llmgw.errors.ChecksumMismatch` naming the file.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from llmgw.errors import ChecksumMismatch, DownloadError, LlmgwError, NotFound
from llmgw.mirror.blobs import CHUNK_SIZE, hash_file
from llmgw.mirror.huggingface import git_blob_sha1
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock


@dataclass(frozen=True)
class Wanted:
    """A file to download and the registry's checksum of it (sha256, else git blob sha1)."""

    filename: str
    url: str
    size: int
    sha256: str | None = None
    git_sha1: str | None = None

    @property
    def key(self) -> str:
        return self.sha256 or self.git_sha1 or self.filename

    @property
    def checked_by(self) -> str:
        return "sha256 (registry)" if self.sha256 else "git sha1 (registry)"


Refusal = Callable[[int, Mapping[str, str], str], LlmgwError]
"""Makes the error for an answer that is not the file: (status, headers, url) -> error to raise."""

RETRIED = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, asyncio.TimeoutError)


def plain_refusal(status: int, headers: Mapping[str, str], url: str) -> LlmgwError:
    """The error for a refused download when the registry has nothing more to say."""
    if status == 404:
        return NotFound(f"{url} answered 404: no such file", "check the model's name and revision")
    return DownloadError(f"{url} answered {status}", "try again later; the registry may be unavailable")


class Downloader:
    """Downloads files into ``folder`` over one aiohttp session, resuming and checking each."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        folder: Path,
        *,
        headers: Mapping[str, str] | None = None,
        refusal: Refusal = plain_refusal,
        clock: Clock = SYSTEM_CLOCK,
        tries: int = 5,
        backoff_s: float = 1.0,
    ) -> None:
        self.session = session
        self.folder = folder
        self.headers = dict(headers or {})
        self.refusal = refusal
        self.clock = clock
        self.tries = max(1, tries)
        self.backoff_s = backoff_s

    def partial_of(self, wanted: Wanted) -> Path:
        return self.folder / f"{wanted.key}.partial"

    async def fetch(self, wanted: Wanted, progress: Callable[[int], None]) -> tuple[Path, str]:
        """The whole, checked file and its sha256; ``progress`` gets the bytes kept after each chunk."""
        partial = self.partial_of(wanted)
        await asyncio.to_thread(self.folder.mkdir, parents=True, exist_ok=True)
        delay = self.backoff_s
        for attempt in range(1, self.tries + 1):
            try:
                await self._try_once(wanted, partial, progress)
                break
            except RETRIED as error:
                if attempt == self.tries:
                    raise DownloadError(
                        f"{wanted.filename}: the download was cut {self.tries} times, last at "
                        f"{_size(partial)} of {wanted.size} bytes ({type(error).__name__}: {error})",
                        "pull again: what arrived is kept and the next pull resumes from there",
                    ) from error
                await self.clock.sleep(delay)
                delay *= 2
        return partial, await asyncio.to_thread(self._check, wanted, partial)

    async def _try_once(self, wanted: Wanted, partial: Path, progress: Callable[[int], None]) -> None:
        kept = _size(partial)
        if kept > wanted.size:
            await asyncio.to_thread(partial.unlink)
            kept = 0
        progress(kept)
        if kept == wanted.size:
            return
        headers = dict(self.headers)
        if kept:
            headers["Range"] = f"bytes={kept}-"
        async with self.session.get(wanted.url, headers=headers) as answer:
            if answer.status == 416:
                await asyncio.to_thread(partial.unlink, missing_ok=True)
                raise aiohttp.ClientPayloadError(f"the server refused the range from {kept}")
            if answer.status not in (200, 206):
                raise self.refusal(answer.status, answer.headers, wanted.url)
            if answer.status == 200 or not _starts_at(answer.headers.get("Content-Range", ""), kept):
                kept = 0
            with partial.open("r+b" if kept else "wb") as target:
                target.seek(kept)
                target.truncate()
                async for chunk in answer.content.iter_chunked(CHUNK_SIZE):
                    if kept + len(chunk) > wanted.size:
                        raise DownloadError(
                            f"{wanted.filename}: the server sent more than the {wanted.size} bytes listed",
                            "the registry's listing and file disagree; pull again later",
                        )
                    await asyncio.to_thread(target.write, chunk)
                    kept += len(chunk)
                    progress(kept)
        if kept < wanted.size:
            raise aiohttp.ClientPayloadError(f"the answer ended at {kept} of {wanted.size} bytes")

    def _check(self, wanted: Wanted, partial: Path) -> str:
        sha256, _ = hash_file(partial)
        if wanted.sha256 and sha256 != wanted.sha256:
            partial.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{wanted.filename}: the registry gave sha256 {wanted.sha256}, the bytes received hash to "
                f"{sha256}; nothing of it was kept",
                "the registry's copy or the way to it is damaged; pull again later, or from another mirror",
            )
        if wanted.git_sha1 and (sha1 := git_blob_sha1(partial)) != wanted.git_sha1:
            partial.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{wanted.filename}: the registry gave git sha1 {wanted.git_sha1}, the bytes received hash "
                f"to {sha1}; nothing of it was kept",
                "the registry's copy or the way to it is damaged; pull again later, or from another mirror",
            )
        return sha256


def _size(path: Path) -> int:
    with contextlib.suppress(FileNotFoundError):
        return path.stat().st_size
    return 0


def _starts_at(content_range: str, offset: int) -> bool:
    """Whether ``Content-Range: bytes START-END/TOTAL`` starts at ``offset``."""
    unit, _, span = content_range.partition(" ")
    start = span.partition("-")[0]
    return unit == "bytes" and start.isdigit() and int(start) == offset
