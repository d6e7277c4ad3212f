"""Batches: each batch's ask and status, and each of its requests with its answer once it came.

A batch and every answer it got live here as they come, so that a new
leader carries a batch on where the last one left it: the requests still
``pending`` are sent again, the answered ones never. An answer is written
once (:meth:`Batches.answer` changes only a request still pending, and counts
it in the same transaction), so each ``custom_id`` has one line in the
batch's output however often its request was sent.

Written through the client store (no fence): a batch is made by whichever
process a client reached, and run by the leader.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, select, update

from llmgw.core.batches import BatchLine, BatchStatus, may_move
from llmgw.errors import Conflict, NotFound
from llmgw.store.clienttables import BatchRequestRow, BatchRow
from llmgw.store.tables import rowcount

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess

PENDING = "pending"
DONE = "done"
FAILED = "failed"

INSERT_CHUNK = 500
"""Requests written per statement when a batch is validated."""


def _no_batch(batch_id: str) -> NotFound:
    return NotFound(f"no batch {batch_id!r}", "GET /v1/batches lists the batches of your key's place")


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A batch as the store keeps it."""

    id: str
    owner: str
    """Where the key that made it sits (``Owner`` text): every key there sees it."""
    key_id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    metadata: dict[str, Any] | None
    total: int
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    output_file_id: str
    error_file_id: str
    errors: list[dict[str, Any]]
    created_at: datetime
    expires_at: datetime
    times: dict[str, float]
    """When it reached each status after ``validating`` (Unix seconds by status name)."""

    @property
    def answered(self) -> int:
        return self.completed + self.failed

    def as_openai(self) -> dict[str, Any]:
        """The batch as OpenAI's API answers it (``openai.types.Batch``)."""
        times = self.times

        def at(status: BatchStatus) -> int | None:
            value = times.get(status.value)
            return None if value is None else int(value)

        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": {"object": "list", "data": self.errors} if self.errors else None,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status.value,
            "output_file_id": self.output_file_id or None,
            "error_file_id": self.error_file_id or None,
            "created_at": int(self.created_at.timestamp()),
            "in_progress_at": at(BatchStatus.IN_PROGRESS),
            "expires_at": int(self.expires_at.timestamp()),
            "finalizing_at": at(BatchStatus.FINALIZING),
            "completed_at": at(BatchStatus.COMPLETED),
            "failed_at": at(BatchStatus.FAILED),
            "expired_at": at(BatchStatus.EXPIRED),
            "cancelling_at": at(BatchStatus.CANCELLING),
            "cancelled_at": at(BatchStatus.CANCELLED),
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "usage": {
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
            "metadata": self.metadata,
        }


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A request of a batch not answered yet."""

    position: int
    custom_id: str
    body: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.body.get("model", ""))


class Batches:
    """Batches by id and their requests: add, read, list, move, answer."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def add(
        self,
        *,
        batch_id: str,
        owner: str,
        key_id: str,
        endpoint: str,
        input_file_id: str,
        completion_window: str,
        window_s: float,
        metadata: dict[str, Any] | None,
    ) -> BatchRecord:
        """Record a new batch, validating; it expires ``window_s`` from now."""
        now = self._store.now()
        row = BatchRow(
            id=batch_id,
            owner=owner,
            key_id=key_id,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            status=BatchStatus.VALIDATING.value,
            meta=metadata,
            total=0,
            completed=0,
            failed=0,
            input_tokens=0,
            output_tokens=0,
            output_file_id="",
            error_file_id="",
            errors=[],
            created_at=now,
            expires_at=now + timedelta(seconds=window_s),
            times={},
            updated_at=now,
        )
        async with self._store.session() as session:
            session.add(row)
        return _record(row)

    async def get(self, batch_id: str) -> BatchRecord:
        """The batch ``batch_id``; NotFound when there is none."""

        async def read(session: Any) -> BatchRecord:
            row = await session.get(BatchRow, batch_id)
            if row is None:
                raise _no_batch(batch_id)
            return _record(row)

        return await self._store.read(read)

    async def list(
        self, owner: str, *, after: str | None = None, limit: int = 20
    ) -> tuple[builtins.list[BatchRecord], bool]:
        """``owner``'s batches, newest first, from the one after ``after``; and whether more follow."""
        query = select(BatchRow).where(BatchRow.owner == owner)
        async with self._store.session() as session:
            if after is not None:
                start = await session.get(BatchRow, after)
                if start is None or start.owner != owner:
                    raise _no_batch(after)
                query = query.where(
                    (BatchRow.created_at < start.created_at)
                    | ((BatchRow.created_at == start.created_at) & (BatchRow.id < start.id))
                )
            query = query.order_by(BatchRow.created_at.desc(), BatchRow.id.desc()).limit(limit + 1)
            rows = list(await session.scalars(query))
        return [_record(row) for row in rows[:limit]], len(rows) > limit

    async def every(self, limit: int) -> builtins.list[BatchRecord]:
        """The newest ``limit`` batches of every owner, newest first."""
        query = select(BatchRow).order_by(BatchRow.created_at.desc(), BatchRow.id.desc()).limit(limit)
        async with self._store.session() as session:
            return [_record(row) for row in await session.scalars(query)]

    async def unended(self) -> builtins.list[BatchRecord]:
        """Every batch not ended, oldest first: what a leader runs."""
        ended = [status.value for status in BatchStatus if status.ended]
        query = (
            select(BatchRow).where(BatchRow.status.not_in(ended)).order_by(BatchRow.created_at, BatchRow.id)
        )
        async with self._store.session() as session:
            return [_record(row) for row in await session.scalars(query)]

    async def move(self, batch_id: str, to: BatchStatus, **values: Any) -> BatchRecord:
        """Move the batch to status ``to`` (stamping when), setting ``values`` (``output_file_id``,
        ``error_file_id``, ``errors``); Conflict when its status may not move there."""
        async with self._store.session() as session:
            row = await session.get(BatchRow, batch_id, with_for_update=True)
            if row is None:
                raise _no_batch(batch_id)
            status = BatchStatus(row.status)
            if not may_move(status, to):
                raise Conflict(
                    f"batch {batch_id} is {status.value}: it cannot become {to.value}",
                    "an ended batch changes no more; a cancelling one only becomes cancelled",
                )
            for key, value in values.items():
                if key not in ("output_file_id", "error_file_id", "errors"):
                    raise ValueError(f"not a column a move sets: {key}")
                setattr(row, key, value)
            now = self._store.now()
            row.status = to.value
            row.times = {**row.times, to.value: now.timestamp()}
            row.updated_at = now
            return _record(row)

    async def add_requests(self, batch_id: str, lines: Sequence[BatchLine]) -> None:
        """Write the batch's requests, all pending (once, when it is validated)."""
        async with self._store.session() as session:
            row = await session.get(BatchRow, batch_id, with_for_update=True)
            if row is None:
                raise _no_batch(batch_id)
            known = await session.scalar(
                select(func.count()).select_from(BatchRequestRow).where(BatchRequestRow.batch_id == batch_id)
            )
            if known:
                return  # written by a leader before this one: they are the same lines
            for start in range(0, len(lines), INSERT_CHUNK):
                session.add_all(
                    BatchRequestRow(
                        batch_id=batch_id,
                        position=line.index,
                        custom_id=line.custom_id,
                        body=line.body,
                        state=PENDING,
                        result=None,
                    )
                    for line in lines[start : start + INSERT_CHUNK]
                )
                await session.flush()
            row.total = len(lines)
            row.updated_at = self._store.now()

    async def pending(self, batch_id: str, limit: int) -> builtins.list[PendingRequest]:
        """Up to ``limit`` requests of the batch not answered yet, in the file's order."""
        query = (
            select(BatchRequestRow.position, BatchRequestRow.custom_id, BatchRequestRow.body)
            .where(BatchRequestRow.batch_id == batch_id, BatchRequestRow.state == PENDING)
            .order_by(BatchRequestRow.position)
            .limit(limit)
        )
        async with self._store.session() as session:
            return [PendingRequest(p, c, dict(b)) for p, c, b in (await session.execute(query)).all()]

    async def answer(
        self,
        batch_id: str,
        position: int,
        *,
        ok: bool,
        result: dict[str, Any],
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> bool:
        """Keep the answer of a pending request and count it; False (nothing changed) when it was
        answered already."""
        async with self._store.session() as session:
            changed = rowcount(
                await session.execute(
                    update(BatchRequestRow)
                    .where(
                        BatchRequestRow.batch_id == batch_id,
                        BatchRequestRow.position == position,
                        BatchRequestRow.state == PENDING,
                    )
                    .values(state=DONE if ok else FAILED, result=result)
                )
            )
            if not changed:
                return False
            counted = BatchRow.completed if ok else BatchRow.failed
            await session.execute(
                update(BatchRow)
                .where(BatchRow.id == batch_id)
                .values(
                    {
                        counted: counted + 1,
                        BatchRow.input_tokens: BatchRow.input_tokens + input_tokens,
                        BatchRow.output_tokens: BatchRow.output_tokens + output_tokens,
                        BatchRow.updated_at: self._store.now(),
                    }
                )
            )
            return True

    async def results(self, batch_id: str) -> builtins.list[tuple[str, dict[str, Any]]]:
        """Each answered request's state (``done``/``failed``) and line, in the file's order."""
        query = (
            select(BatchRequestRow.state, BatchRequestRow.result)
            .where(BatchRequestRow.batch_id == batch_id, BatchRequestRow.state != PENDING)
            .order_by(BatchRequestRow.position)
        )
        async with self._store.session() as session:
            return [(state, dict(result or {})) for state, result in (await session.execute(query)).all()]

    async def delete_ended_before(self, when: datetime) -> int:
        """Remove batches that ended before ``when`` (their requests go with them); how many."""
        ended = [status.value for status in BatchStatus if status.ended]
        async with self._store.session() as session:
            ids = list(
                await session.scalars(
                    select(BatchRow.id).where(BatchRow.status.in_(ended), BatchRow.updated_at < when)
                )
            )
            if ids:
                await session.execute(delete(BatchRequestRow).where(BatchRequestRow.batch_id.in_(ids)))
                await session.execute(delete(BatchRow).where(BatchRow.id.in_(ids)))
            return len(ids)


def _record(row: BatchRow) -> BatchRecord:
    return BatchRecord(
        id=row.id,
        owner=row.owner,
        key_id=row.key_id,
        endpoint=row.endpoint,
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        status=BatchStatus(row.status),
        metadata=dict(row.meta) if row.meta is not None else None,
        total=row.total,
        completed=row.completed,
        failed=row.failed,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        errors=list(row.errors),
        created_at=row.created_at,
        expires_at=row.expires_at,
        times=dict(row.times),
    )
