"""ComfyUI jobs any process answers for: their records in the client store, their files in ``/v1/files``,
and the leader's pickup of a job whose process died.

A control plane and each of its gateway workers follow the jobs they took
and write them (:class:`StoreJobRecords`, the gateway's
:class:`~llmgw.gateway.jobs.JobRecords`): any of them then answers
``GET /v1/jobs/{id}``, and a ``DELETE`` reaching one that does not run the job
is passed to its runner through the store. The files a job makes are files
of its key's place (purpose ``job_output``, expiring after
``gateway.files_kept_s``: :class:`FileBookJobFiles`), readable through any
plane for their lifetime.

:class:`JobPickup` is a leader duty: a job whose runner has not written it
for ``gateway.job_orphan_s`` (its process was killed, its plane failed over)
is claimed by the leader (one claimant wins) and followed on its replica's
gate from its prompt id, so it ends as it would have; one never queued is
queued. Ended jobs are forgotten ``gateway.job_kept_s`` after they ended.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from llmgw.controlplane.serving.filebook import MirrorFileBook
from llmgw.errors import StoreError
from llmgw.gateway import metrics
from llmgw.gateway.app import Gateway
from llmgw.gateway.files import content_type
from llmgw.gateway.jobs import ENDED, Job, JobSaved, JobState, MadeFile
from llmgw.gateway.usage import UsageRecord
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.store.database import Store
from llmgw.store.jobs import JobRecord

log = logging.getLogger(__name__)

PICKUP_S = 2.0
"""How often the leader looks for jobs whose runner went silent."""


def runner_name(plane: str, worker: int | None = None) -> str:
    """This process as a job's record names its runner."""
    where = "plane" if worker is None else f"worker{worker}"
    return f"{plane}/{where}/{os.getpid()}"


def _made(files: list[dict[str, Any]]) -> list[MadeFile]:
    return [MadeFile(f["id"], f["filename"], f["content_type"], int(f["bytes"])) for f in files]


def job_of(record: JobRecord) -> Job:
    """The job a record holds, as ``GET /v1/jobs/{id}`` shows it (its workflow not known here)."""
    progress = record.progress
    job = Job(
        record.id,
        record.key_id,
        record.model,
        record.graph,
        None,
        int(record.created_at.timestamp()),
        record.owner,
        record.served_by,
    )
    job.state = JobState(record.state)
    job.ahead = int(progress.get("ahead", 0))
    job.node = progress.get("node")
    job.step, job.steps = int(progress.get("step", 0)), int(progress.get("steps", 0))
    job.percent = float(progress.get("percent", 0.0))
    job.error = progress.get("error")
    job.status = int(progress.get("status", 502))
    job.files = _made(record.files)
    job.replica_id, job.prompt_id = record.replica_id, record.prompt_id or None
    return job


class StoreJobRecords:
    """The gateway's job records on the client store, written as ``runner``."""

    def __init__(self, clients: Store, runner: str) -> None:
        self._jobs = clients.jobs
        self._clients = clients
        self.runner = runner

    async def add(self, job: Job) -> None:
        await self._jobs.add(
            job_id=job.job_id,
            key_id=job.key_id,
            owner=job.owner,
            model=job.model,
            served_by=job.served_by,
            graph=job.graph,
            runner=self.runner,
            created_at=datetime.fromtimestamp(job.created_at, UTC),
        )

    async def save(self, job: Job, ended: bool = False) -> JobSaved:
        saved = await self._jobs.save(
            job.job_id,
            self.runner,
            state=job.state.value,
            progress=job.progress_fields(),
            files=[{k: v for k, v in f.as_json("").items() if k != "url"} for f in job.files],
            replica_id=job.replica_id,
            prompt_id=job.prompt_id or "",
            ended=ended,
        )
        return JobSaved(saved.kept, saved.cancel_asked)

    async def get(self, job_id: str, key_id: str) -> Job | None:
        record = await self._jobs.get(job_id, key_id)
        return None if record is None else job_of(record)

    async def ask_cancel(self, job_id: str, key_id: str) -> Job | None:
        record = await self._jobs.ask_cancel(job_id, key_id)
        return None if record is None else job_of(record)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


class FileBookJobFiles:
    """A job's files as files of its key's place (``/v1/files``, purpose ``job_output``)."""

    def __init__(self, book: MirrorFileBook, kept_s: float) -> None:
        self._book = book
        self._kept_s = kept_s

    async def put(self, job: Job, filename: str, data: bytes) -> MadeFile:
        kept = await self._book.keep(job.owner, job.key_id, "job_output", filename, _one(data), self._kept_s)
        return MadeFile(str(kept["id"]), filename, content_type(filename), len(data), data)


class JobPickup:
    """The leader's duty: take over the jobs whose runner went silent, forget the long ended."""

    def __init__(
        self,
        clients: Store,
        gateway: Gateway,
        runner: str,
        *,
        orphan_s: float,
        kept_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._clients = clients
        self._gateway = gateway
        self._runner = runner
        self._orphan_s = orphan_s
        self._kept_s = kept_s
        self._clock = clock

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except StoreError as error:
                log.warning("jobs were not looked after this time: %s", error)
            await self._clock.sleep(PICKUP_S)

    async def pass_once(self) -> list[str]:
        """One look: the ids of the jobs taken over."""
        jobs = self._clients.jobs
        now = self._clients.now()
        silent_since = now - timedelta(seconds=self._orphan_s)
        taken = []
        for record in await jobs.orphaned(silent_since):
            if not await jobs.claim(record.id, self._runner, silent_since):
                continue  # another plane took it first
            self._adopt(record)
            taken.append(record.id)
        await jobs.delete_ended_before(now - timedelta(seconds=self._kept_s))
        return taken

    def _adopt(self, record: JobRecord) -> None:
        job = job_of(record)
        entry = self._gateway.catalog.get(record.model)
        job.workflow = entry.workflow if entry is not None else None
        log.info(
            "job %s (%s) was followed by %s, silent for %.0f s: carried on here",
            record.id,
            record.model,
            record.runner,
            self._orphan_s,
        )
        started = self._clock.monotonic()
        key = self._gateway.keys.get(record.key_id)
        telling = self._gateway.telling

        def ended(done: Job) -> None:
            if not done.replica_id or done.state not in ENDED:
                return
            units = 1 if done.state is JobState.DONE else 0
            status = {JobState.DONE: 200, JobState.CANCELLED: 499}.get(done.state, done.status)
            duration = self._clock.monotonic() - started
            place = metrics.project_of(key)
            usage = UsageRecord(
                done.key_id,
                done.model,
                done.replica_id,
                0,
                units,
                status,
                duration,
                place,
                generation_s=duration,
            )
            telling.request_ended(usage)

        self._gateway.jobs.adopt(job, ended)
