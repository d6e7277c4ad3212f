"""The gateway's :class:`~llmgw.gateway.batch_routes.BatchBook` on the store, and the files batches use.

Every process that serves ``/v1`` (leader, standby, gateway worker) records
and reads batches here, on its client store (no fence); the leader runs them
(:mod:`llmgw.controlplane.serving.batching`). A batch belongs to the place of
the key that made it (:attr:`KeyEntry.place`): every key there sees it.
"""

from __future__ import annotations

from typing import Any, Protocol

from llmgw.core.batches import COMPLETION_WINDOWS, BatchStatus, new_batch_id
from llmgw.errors import Conflict, NotFound
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.keys import KeyEntry
from llmgw.store.batches import Batches


def owner_of(key: KeyEntry) -> str:
    """Where a key's batches and files belong: its place, as text."""
    return str(key.place.at)


class BatchFiles(Protocol):
    """The files a batch reads its requests from and writes its answers to (``/v1/files``)."""

    async def is_batch_input(self, owner: str, file_id: str) -> bool:
        """Whether ``owner`` has file ``file_id`` with purpose ``batch``."""
        ...

    async def batch_input(self, owner: str, file_id: str) -> bytes | None:
        """The bytes of file ``file_id`` when ``owner`` has it with purpose ``batch``; None otherwise."""
        ...

    async def write_output(self, owner: str, filename: str, data: bytes) -> str:
        """Keep a batch's output (or error) file for ``owner``; its id."""
        ...


class StoreBatchBook:
    """Batches in the store, as ``/v1/batches`` asks for them."""

    def __init__(self, batches: Batches, files: BatchFiles) -> None:
        self._batches = batches
        self._files = files

    async def create(
        self,
        key: KeyEntry,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None,
    ) -> dict[str, Any]:
        owner = owner_of(key)
        if not await self._files.is_batch_input(owner, input_file_id):
            raise ApiError(
                400,
                f"No file '{input_file_id}' with purpose 'batch' for your key's place: upload the requests "
                "with POST /v1/files (purpose 'batch') and name the id it answers.",
                "invalid_request",
                "input_file_id",
            )
        record = await self._batches.add(
            batch_id=new_batch_id(),
            owner=owner,
            key_id=key.key_id,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            window_s=COMPLETION_WINDOWS[completion_window],
            metadata=metadata,
        )
        return record.as_openai()

    async def get(self, key: KeyEntry, batch_id: str) -> dict[str, Any] | None:
        try:
            record = await self._batches.get(batch_id)
        except NotFound:
            return None
        return record.as_openai() if record.owner == owner_of(key) else None

    async def list(self, key: KeyEntry, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        try:
            records, more = await self._batches.list(owner_of(key), after=after, limit=limit)
        except NotFound as error:
            raise ApiError(
                400, f"'after' names no batch of your key's place ({after!r}).", "invalid_request", "after"
            ) from error
        return [record.as_openai() for record in records], more

    async def cancel(self, key: KeyEntry, batch_id: str) -> dict[str, Any] | None:
        try:
            record = await self._batches.get(batch_id)
        except NotFound:
            return None
        if record.owner != owner_of(key):
            return None
        if record.status.ended or record.status is BatchStatus.CANCELLING:
            return record.as_openai()
        if record.status is BatchStatus.FINALIZING:
            raise ApiError(
                409,
                f"Batch '{batch_id}' is finalizing: every request was answered, so it cannot be cancelled.",
                "batch_not_cancellable",
            )
        try:
            return (await self._batches.move(batch_id, BatchStatus.CANCELLING)).as_openai()
        except Conflict:  # it moved meanwhile (the leader finalized it): as it is now
            return (await self._batches.get(batch_id)).as_openai()
