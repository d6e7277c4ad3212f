"""The gateway's :class:`~llmgw.gateway.file_routes.FileBook`: rows in the client store, bytes in the mirror.

Every process that serves ``/v1`` keeps and reads files here: a control
plane (leader or standby) and its gateway workers, which share its mirror
folder. An upload is streamed into the mirror as a blob of kind ``file``
(hashed on the way, never held whole), then recorded: the file's row first,
then the blob's (:meth:`ClientFiles.release` forgets a blob only while no row
names it). On a control plane the upload answers once the copies wanted are
held (the mirror replicator's :meth:`~MirrorReplicator.acknowledge`, as an
import does); a worker's upload is credited to its plane at the replicator's
next pass. A plane asked for a file whose blob it lacks yet pulls it from a
peer at once (``pull_now``); a worker answers 503 to be asked again.

A file belongs to the place of the key that uploaded it (``owner_of``):
every key there reads, lists and deletes it. A place keeps at most
``files.place_max_bytes``. A file uploaded for a batch is checked as a
batch's input at upload (400 naming the first bad line) and, like a batch's
output and errors, expires after ``files.batch_kept_s`` unless the upload
says otherwise; other files are kept until deleted. :class:`FileExpiry`, a
leader duty, deletes the files past their expiry.

It is also the batches' :class:`~llmgw.controlplane.serving.batchbook.BatchFiles`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from llmgw.controlplane.config import FileSettingsFile
from llmgw.controlplane.mirror.replicating import MirrorReplicator
from llmgw.controlplane.serving.batchbook import owner_of
from llmgw.core.batches import BatchInputError, check_input_file
from llmgw.errors import StorageFull, StoreError, ValidationFailed
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.keys import KeyEntry
from llmgw.mirror.blobs import BlobStore
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.store.database import Store

log = logging.getLogger(__name__)

BATCH_PURPOSES = ("batch", "batch_output")
"""Purposes whose files expire after ``files.batch_kept_s`` by default."""
RETRY_S = 2


@dataclass(frozen=True, slots=True)
class FileSettings:
    max_bytes: int = 512 << 20
    place_max_bytes: int = 100 << 30
    batch_kept_s: float = 30 * 24 * 3600.0
    sweep_s: float = 60.0

    @classmethod
    def of(cls, config: FileSettingsFile) -> FileSettings:
        return cls(config.max_bytes, config.place_max_bytes, config.batch_kept_s, config.sweep_s)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


class MirrorFileBook:
    """Client files: rows in ``clients`` (the client store), bytes in ``blobs`` (this plane's mirror)."""

    def __init__(
        self,
        clients: Store,
        blobs: BlobStore,
        replicator: MirrorReplicator | None = None,
        settings: FileSettings = FileSettings(),
    ) -> None:
        self._clients = clients
        self._blobs = blobs
        self._replicator = replicator
        """This plane's (None in a gateway worker: its plane's replicator credits the copy)."""
        self.settings = settings
        self.max_bytes = settings.max_bytes

    async def add(
        self,
        key: KeyEntry,
        purpose: str,
        filename: str,
        chunks: AsyncIterator[bytes],
        expires_s: float | None,
    ) -> dict[str, Any]:
        return await self.keep(owner_of(key), key.key_id, purpose, filename, chunks, expires_s)

    async def keep(
        self,
        owner: str,
        key_id: str,
        purpose: str,
        filename: str,
        chunks: AsyncIterator[bytes],
        expires_s: float | None,
    ) -> dict[str, Any]:
        """Store the bytes and record the file for ``owner``; its FileObject."""
        settings = self.settings
        try:
            info = await self._blobs.import_stream(chunks, filename, max_bytes=settings.max_bytes)
        except ValidationFailed as error:
            raise ApiError(
                413,
                f"The file is larger than the {settings.max_bytes} bytes a file may have here; split it.",
                "file_too_large",
                "file",
            ) from error
        except StorageFull as error:
            raise ApiError(
                507,
                "The control plane's disk is full: the file was not kept. Try again later.",
                "storage_full",
                hint="an administrator frees room in the mirror's folder",
            ) from error
        try:
            if purpose == "batch":
                await self._check_batch_input(info.sha256)
            used = await self._clients.files.bytes_of(owner)
            if used + info.size > settings.place_max_bytes:
                raise ApiError(
                    413,
                    f"Your key's place keeps {used} bytes of files; this one's {info.size} would pass its "
                    f"{settings.place_max_bytes}. Delete files you no longer need (DELETE /v1/files/{{id}}).",
                    "files_quota_exceeded",
                    "file",
                )
        except BaseException:
            await self._drop_unrecorded(info.sha256)
            raise
        if expires_s is None and purpose in BATCH_PURPOSES:
            expires_s = settings.batch_kept_s
        record = await self._clients.files.add(
            owner=owner,
            key_id=key_id,
            purpose=purpose,
            filename=filename,
            size=info.size,
            sha256=info.sha256,
            expires_s=expires_s,
        )
        await self._clients.blobs.add(info.sha256, info.size, filename, "file")
        if not await asyncio.to_thread(self._blobs.has, info.sha256):
            # the same bytes' last file was deleted meanwhile and the replicator took them away
            await self._clients.files.delete(owner, record.id)
            raise ApiError(
                503,
                "The upload raced a deletion of the same bytes: send it again.",
                "retry",
                retry_after=RETRY_S,
            )
        if self._replicator is not None:
            await self._replicator.acknowledge(info.sha256)
        return record.as_openai()

    async def _check_batch_input(self, sha256: str) -> None:
        data = await asyncio.to_thread(self._blobs.path_of(sha256).read_bytes)
        try:
            await asyncio.to_thread(check_input_file, data)
        except BatchInputError as error:
            raise ApiError(
                400,
                f"The file is not a batch's input: {error}. Each line is one request: "
                '{"custom_id": …, "method": "POST", "url": "/v1/chat/completions", "body": {…}}.',
                "invalid_batch_input",
                "file",
            ) from error

    async def _drop_unrecorded(self, sha256: str) -> None:
        """Remove a blob just imported and refused, unless a file already had the same bytes."""
        try:
            if any(b.sha256 == sha256 for b in await self._clients.blobs.list()):
                return
        except StoreError:
            return  # not knowing, keep it: the replicator never removes an unrecorded blob
        await asyncio.to_thread(self._blobs.remove, sha256)

    async def get(self, key: KeyEntry, file_id: str) -> dict[str, Any] | None:
        record = await self._clients.files.get(owner_of(key), file_id)
        return None if record is None else record.as_openai()

    async def list(
        self, key: KeyEntry, *, purpose: str | None, after: str | None, limit: int, newest_first: bool
    ) -> tuple[list[dict[str, Any]], bool]:
        page = await self._clients.files.list(
            owner_of(key), purpose=purpose, after=after, limit=limit, newest_first=newest_first
        )
        if page is None:
            raise ApiError(
                400, f"'after' names no file of your key's place ({after!r}).", "invalid_request", "after"
            )
        return [record.as_openai() for record in page[0]], page[1]

    async def content(
        self, key: KeyEntry, file_id: str
    ) -> tuple[dict[str, Any], AsyncIterator[bytes]] | None:
        record = await self._clients.files.get(owner_of(key), file_id)
        if record is None:
            return None
        await self._have(record.sha256)
        return record.as_openai(), self._blobs.read_chunks(record.sha256)

    async def _have(self, sha256: str) -> None:
        if await asyncio.to_thread(self._blobs.has, sha256):
            return
        if self._replicator is not None and await self._replicator.pull_now(sha256):
            return
        raise ApiError(
            503,
            "The file's bytes are still being copied to this control plane: ask again in a moment.",
            "file_not_ready",
            retry_after=RETRY_S,
        )

    async def delete(self, key: KeyEntry, file_id: str) -> bool:
        record = await self._clients.files.delete(owner_of(key), file_id)
        if record is None:
            return False
        await self._clients.files.release(record.sha256)
        return True

    # the batches' files (BatchFiles)

    async def is_batch_input(self, owner: str, file_id: str) -> bool:
        record = await self._clients.files.get(owner, file_id)
        return record is not None and record.purpose == "batch"

    async def batch_input(self, owner: str, file_id: str) -> bytes | None:
        record = await self._clients.files.get(owner, file_id)
        if record is None or record.purpose != "batch":
            return None
        await self._have(record.sha256)
        return await asyncio.to_thread(self._blobs.path_of(record.sha256).read_bytes)

    async def write_output(self, owner: str, filename: str, data: bytes) -> str:
        written = await self.keep(owner, "", "batch_output", filename, _one(data), None)
        return str(written["id"])


class FileExpiry:
    """The leader's duty: every ``files.sweep_s``, delete the files past their expiry and release
    their blobs (each plane's replicator then removes its copy)."""

    def __init__(
        self, clients: Store, settings: FileSettings = FileSettings(), clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._clients = clients
        self._settings = settings
        self._clock = clock

    async def run(self) -> None:
        while True:
            try:
                await self.sweep()
            except StoreError as error:
                log.warning("expired files were not swept this time: %s", error)
            await self._clock.sleep(self._settings.sweep_s)

    async def sweep(self) -> int:
        """Delete every file past its expiry (500 at a time); how many went."""
        gone = 0
        while expired := await self._clients.files.expired():
            gone += len(expired)
            for sha256 in {record.sha256 for record in expired}:
                await self._clients.files.release(sha256)
        if gone:
            log.info("deleted %d files past their expiry", gone)
        return gone
