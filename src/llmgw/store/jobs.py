"""ComfyUI jobs: what ``/v1/jobs`` made, where each runs and how far it is, readable by any process.

A job is written by the process that took it (a control plane or a gateway
worker: its *runner*) as it goes: queued on which replica under which prompt
id, its progress, what it made, how it ended. Each write is also the
runner's heartbeat. A runner that stops writing (its process died) leaves its
job to the leader, which claims it (:meth:`WorkflowJobs.claim`: only while
the heartbeat is still stale, so one process alone takes it) and follows it
on its replica's gate from its prompt id. A runner whose job was claimed
finds its next :meth:`WorkflowJobs.save` refused, and stops following.

``DELETE /v1/jobs/{id}`` reaching a process that does not run the job asks
the runner (:meth:`WorkflowJobs.ask_cancel`); the runner reads it at its next
save. Written through the client store (no fence).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select, update

from llmgw.store.clienttables import WorkflowJobRow
from llmgw.store.tables import rowcount

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess

UNENDED = ("queued", "running")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as the store keeps it."""

    id: str
    key_id: str
    owner: str
    model: str
    served_by: str
    graph: dict[str, Any]
    state: str
    progress: dict[str, Any]
    files: list[dict[str, Any]]
    replica_id: str
    prompt_id: str
    runner: str
    heartbeat_at: datetime
    cancel_asked: bool
    created_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class Saved:
    """What a runner's write found: whether the job is still its own, and whether its key asked to
    cancel it."""

    kept: bool
    cancel_asked: bool = False


class WorkflowJobs:
    """Jobs by id: add, save (the runner's heartbeat), read, ask to cancel, claim, forget."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def add(
        self,
        *,
        job_id: str,
        key_id: str,
        owner: str,
        model: str,
        served_by: str,
        graph: dict[str, Any],
        runner: str,
        created_at: datetime,
    ) -> None:
        now = self._store.now()
        row = WorkflowJobRow(
            id=job_id,
            key_id=key_id,
            owner=owner,
            model=model,
            served_by=served_by,
            graph=graph,
            state="queued",
            progress={},
            files=[],
            replica_id="",
            prompt_id="",
            runner=runner,
            heartbeat_at=now,
            cancel_asked=False,
            created_at=created_at,
            ended_at=None,
        )
        async with self._store.session() as session:
            session.add(row)

    async def save(
        self,
        job_id: str,
        runner: str,
        *,
        state: str,
        progress: dict[str, Any],
        files: builtins.list[dict[str, Any]],
        replica_id: str,
        prompt_id: str,
        ended: bool,
    ) -> Saved:
        """Write the job as ``runner`` sees it (and its heartbeat); refused when another runner took it."""
        now = self._store.now()
        values: dict[str, Any] = {
            "state": state,
            "progress": progress,
            "files": files,
            "replica_id": replica_id,
            "prompt_id": prompt_id,
            "heartbeat_at": now,
        }
        if ended:
            values["ended_at"] = now
        statement = (
            update(WorkflowJobRow)
            .where(WorkflowJobRow.id == job_id, WorkflowJobRow.runner == runner)
            .values(**values)
        )
        async with self._store.session() as session:
            if not rowcount(await session.execute(statement)):
                return Saved(kept=False)
            asked = await session.scalar(
                select(WorkflowJobRow.cancel_asked).where(WorkflowJobRow.id == job_id)
            )
        return Saved(kept=True, cancel_asked=bool(asked))

    async def get(self, job_id: str, key_id: str | None = None) -> JobRecord | None:
        """Job ``job_id`` (when ``key_id`` is given: only if that key made it); None otherwise."""

        async def read(session: Any) -> JobRecord | None:
            row = await session.get(WorkflowJobRow, job_id)
            if row is None or (key_id is not None and row.key_id != key_id):
                return None
            return _record(row)

        return await self._store.read(read)

    async def ask_cancel(self, job_id: str, key_id: str) -> JobRecord | None:
        """Ask the runner of ``key_id``'s unended job to cancel it; the job, or None when there is none."""
        statement = (
            update(WorkflowJobRow)
            .where(WorkflowJobRow.id == job_id, WorkflowJobRow.key_id == key_id)
            .where(WorkflowJobRow.state.in_(UNENDED))
            .values(cancel_asked=True)
        )
        async with self._store.session() as session:
            await session.execute(statement)
        return await self.get(job_id, key_id)

    async def orphaned(self, silent_since: datetime) -> builtins.list[JobRecord]:
        """The unended jobs whose runner has not written them since ``silent_since``."""
        query = (
            select(WorkflowJobRow)
            .where(WorkflowJobRow.state.in_(UNENDED), WorkflowJobRow.heartbeat_at < silent_since)
            .order_by(WorkflowJobRow.created_at)
        )
        async with self._store.session() as session:
            return [_record(row) for row in await session.scalars(query)]

    async def claim(self, job_id: str, runner: str, silent_since: datetime) -> bool:
        """Make ``runner`` the job's runner while its heartbeat is older than ``silent_since``; whether
        it did (one claimant wins)."""
        statement = (
            update(WorkflowJobRow)
            .where(WorkflowJobRow.id == job_id, WorkflowJobRow.heartbeat_at < silent_since)
            .where(WorkflowJobRow.state.in_(UNENDED))
            .values(runner=runner, heartbeat_at=self._store.now())
        )
        async with self._store.session() as session:
            return bool(rowcount(await session.execute(statement)))

    async def delete_ended_before(self, before: datetime) -> int:
        """Forget the jobs that ended before ``before``; how many went."""
        statement = delete(WorkflowJobRow).where(
            WorkflowJobRow.ended_at.is_not(None), WorkflowJobRow.ended_at < before
        )
        async with self._store.session() as session:
            return rowcount(await session.execute(statement))


def _record(row: WorkflowJobRow) -> JobRecord:
    return JobRecord(
        id=row.id,
        key_id=row.key_id,
        owner=row.owner,
        model=row.model,
        served_by=row.served_by,
        graph=row.graph,
        state=row.state,
        progress=row.progress,
        files=row.files,
        replica_id=row.replica_id,
        prompt_id=row.prompt_id,
        runner=row.runner,
        heartbeat_at=row.heartbeat_at,
        cancel_asked=row.cancel_asked,
        created_at=row.created_at,
        ended_at=row.ended_at,
    )
