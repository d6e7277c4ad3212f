"""Training jobs: each job's ask, its pairs, where it runs, its progress and its results.

The job and its progress live here so that a new leader carries every job
on where the last one left it (docs/training.md, "Failover"). A change is
made by :meth:`TrainingJobs.change` with the attempt it expects, so a late
status of an earlier attempt never overwrites the job's newer one.
"""

from __future__ import annotations

import builtins
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from llmgw.core.tenancy import Owner
from llmgw.core.training import JobState
from llmgw.errors import Conflict, NotFound
from llmgw.store.tables import TrainingJobRow

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess

CHANGEABLE = frozenset(
    {"state", "node_id", "device", "attempt", "progress", "logs", "results", "reasons", "error", "retry"}
)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A training job as the store keeps it."""

    id: str
    owner: Owner
    model: str
    state: JobState
    node: str
    """The node asked for, or ``any``."""
    node_id: str
    """The node it is placed on; empty while queued."""
    device: str
    memory_mb: int
    attempt: int
    retry: int
    """Placements again it may still have when its node goes."""
    spec: dict[str, Any]
    pairs: bytes
    progress: dict[str, Any]
    logs: list[str]
    results: list[dict[str, Any]]
    reasons: str
    """Why it is queued: each node's refusal."""
    error: str
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None

    @property
    def device_kind(self) -> str:
        return str(self.spec.get("device_kind", "card"))

    @property
    def gguf(self) -> bool:
        return bool(self.spec.get("gguf", False))

    @property
    def weights(self) -> list[dict[str, Any]]:
        return list(self.spec.get("weights", []))

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.spec.get("options", {}))

    @property
    def collections(self) -> list[str]:
        """The knowledge collections its pairs came from (empty: uploaded)."""
        return list(self.spec.get("collections", []))


def new_job_id() -> str:
    return "tj_" + secrets.token_hex(6)


class TrainingJobs:
    """Jobs by id: add, read, list, change."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def add(
        self,
        *,
        owner: Owner,
        model: str,
        node: str,
        memory_mb: int,
        retry: int,
        spec: dict[str, Any],
        pairs: bytes,
        job_id: str = "",
    ) -> JobRecord:
        """Record a new job, queued, attempt 0."""
        now = self._store.now()
        row = TrainingJobRow(
            id=job_id or new_job_id(),
            owner=str(owner),
            model=model,
            state=JobState.QUEUED.value,
            node=node,
            node_id="",
            device="",
            memory_mb=memory_mb,
            attempt=0,
            retry=retry,
            spec=dict(spec),
            pairs=pairs,
            progress={},
            logs=[],
            results=[],
            reasons="",
            error="",
            created_at=now,
            updated_at=now,
            ended_at=None,
        )
        async with self._store.session() as session:
            session.add(row)
        return _record(row)

    async def get(self, job_id: str) -> JobRecord:
        """The job ``job_id``; NotFound when there is none."""
        async with self._store.session() as session:
            row = await session.get(TrainingJobRow, job_id)
            if row is None:
                raise NotFound(f"no training job {job_id!r}", "'llmgw ctl train list' lists the jobs")
            return _record(row)

    async def list(self, *, unfinished: bool = False) -> builtins.list[JobRecord]:
        """Every job, oldest first; with ``unfinished`` only those not ended."""
        query = select(TrainingJobRow).order_by(TrainingJobRow.created_at, TrainingJobRow.id)
        if unfinished:
            ended = [JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value]
            query = query.where(TrainingJobRow.state.not_in(ended))
        async with self._store.session() as session:
            return [_record(row) for row in await session.scalars(query)]

    async def change(self, job_id: str, expect: int | None = None, **values: Any) -> JobRecord:
        """Set ``values`` (columns of :data:`CHANGEABLE`) on the job; with ``expect``, only while the
        job is still at that attempt (Conflict otherwise: a newer attempt took over)."""
        unknown = set(values) - CHANGEABLE
        if unknown:
            raise ValueError(f"not a changeable column of a training job: {sorted(unknown)}")
        async with self._store.session() as session:
            row = await session.get(TrainingJobRow, job_id, with_for_update=True)
            if row is None:
                raise NotFound(f"no training job {job_id!r}", "'llmgw ctl train list' lists the jobs")
            if expect is not None and row.attempt != expect:
                raise Conflict(
                    f"training job {job_id} is at attempt {row.attempt}, not {expect}",
                    "a newer attempt took over; nothing of the older one is kept",
                )
            for key, value in values.items():
                setattr(row, key, value.value if isinstance(value, JobState) else value)
            row.updated_at = self._store.now()
            if JobState(row.state).ended and row.ended_at is None:
                row.ended_at = row.updated_at
            return _record(row)


def _record(row: TrainingJobRow) -> JobRecord:
    return JobRecord(
        id=row.id,
        owner=Owner.parse(row.owner),
        model=row.model,
        state=JobState(row.state),
        node=row.node,
        node_id=row.node_id,
        device=row.device,
        memory_mb=row.memory_mb,
        attempt=row.attempt,
        retry=row.retry,
        spec=dict(row.spec),
        pairs=bytes(row.pairs),
        progress=dict(row.progress),
        logs=list(row.logs),
        results=list(row.results),
        reasons=row.reasons,
        error=row.error,
        created_at=row.created_at,
        updated_at=row.updated_at,
        ended_at=row.ended_at,
    )
