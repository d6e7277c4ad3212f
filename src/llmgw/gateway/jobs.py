"""Jobs: one ComfyUI workflow run on a replica's gate, followed by the router while it waits.

A job is taken (``POST /v1/jobs``, or one per picture of an images request),
kept in :class:`JobBook` under its key and run by one task
(:meth:`JobRunner.start`): a ready replica is picked (waited for as any
request waits, :mod:`llmgw.gateway.finding`), the workflow is queued on its gate,
and the gate's ``/progress`` is polled every ``job_poll_s`` and written into
the job (queued and how many ahead; running, node, step of steps, percent)
until it is done (its files fetched, an OBJ turned into a GLB, kept through
:class:`JobFiles`) or failed (why). A job longer than ``job_timeout_s`` fails
and is cancelled on the gate.

A ``/v1/jobs`` job is also written through :class:`JobRecords` when the
gateway has them (the control plane's, on the store): once before its 202,
then at every change of its progress and at least every
:data:`HEARTBEAT_S`, so that any process answers ``GET /v1/jobs/{id}`` and
passes a ``DELETE`` on to the process running it (read at its next write),
and the leader takes over a job whose process died
(``controlplane/serving/jobrecords.py``) and follows it on the gate from its
prompt id (:meth:`JobRunner.adopt`). Without records, jobs live in this
process's memory only. In memory: at most ``jobs_kept``, each kept
``job_kept_s`` after it ended. Only the key that made a job reads or cancels
it; to any other key it does not exist.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.files import FileStore
from llmgw.gateway.finding import ReplicaFinder
from llmgw.gateway.gate import GateClient, GateError, OutputFile, Progress
from llmgw.gateway.meshes import MeshError, glb_name, obj_to_glb
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.workflows import Workflow

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
"""Longest a recorded job goes unwritten while its runner follows it (its heartbeat)."""


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


ENDED = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True, slots=True)
class MadeFile:
    """A file a job made, as its JSON names it; its bytes are here only in the process that made it."""

    file_id: str
    filename: str
    content_type: str
    size: int
    data: bytes | None = None

    def as_json(self, files_url: str) -> dict[str, Any]:
        return {
            "id": self.file_id,
            "filename": self.filename,
            "content_type": self.content_type,
            "bytes": self.size,
            "url": f"{files_url}/{self.file_id}/content",
        }


@dataclass(eq=False)
class Job:
    """One workflow run, as its key reads it back."""

    job_id: str
    key_id: str
    model: str
    graph: dict[str, Any]
    workflow: Workflow | None
    """None for a job read back from the records (it is not run here)."""
    created_at: int
    owner: str = ""
    """The place of the key that made it (its files belong there)."""
    served_by: str = ""
    """The model whose replicas run it: an environment's entry for a member; empty: ``model``'s own."""
    state: JobState = JobState.QUEUED
    ahead: int = 0
    node: str | None = None
    step: int = 0
    steps: int = 0
    percent: float = 0.0
    error: str | None = None
    status: int = 502
    """The HTTP status its failure answers as (a picture's request; its usage record)."""
    files: list[MadeFile] = field(default_factory=list)
    replica_id: str = ""
    prompt_id: str | None = None
    ended_at: float | None = None
    """When it ended (the book's clock); None while it runs."""
    taken: bool = False
    """Another process took it over (this one was silent too long): it ends here unended, and that
    process counts it."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def follow(self, progress: Progress) -> None:
        """Write the gate's word into the job."""
        self.ahead = progress.ahead
        self.node = progress.node
        self.step, self.steps = progress.step, progress.steps
        self.percent = (
            max(self.percent, progress.percent) if progress.state == "running" else progress.percent
        )
        if progress.state in ("queued", "running"):
            self.state = JobState(progress.state)

    def as_json(self, files_url: str) -> dict[str, Any]:
        """The job as ``GET /v1/jobs/{id}`` answers it (``files_url``: where ``/v1/files`` is)."""
        return {
            "id": self.job_id,
            "object": "job",
            "model": self.model,
            "created_at": self.created_at,
            "state": self.state.value,
            "ahead": self.ahead if self.state is JobState.QUEUED else 0,
            "node": self.node if self.state is JobState.RUNNING else None,
            "step": self.step,
            "steps": self.steps,
            "percent": 100.0 if self.state is JobState.DONE else round(self.percent, 1),
            "error": self.error,
            "files": [f.as_json(files_url) for f in self.files],
        }

    def progress_fields(self) -> dict[str, Any]:
        """What a record keeps of its progress (:class:`JobRecords`)."""
        return {
            "ahead": self.ahead,
            "node": self.node,
            "step": self.step,
            "steps": self.steps,
            "percent": self.percent,
            "error": self.error,
            "status": self.status,
        }

    def written(self) -> tuple[Any, ...]:
        """What a change of makes a record's write due."""
        return (self.state, self.ahead, self.node, self.step, self.steps, round(self.percent), self.prompt_id)


class JobBook:
    """The jobs this gateway holds, by id, bounded in number and in time after they end."""

    def __init__(self, max_jobs: int, kept_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_jobs = max_jobs
        self.kept_s = kept_s
        self.clock = clock
        self._jobs: OrderedDict[str, Job] = OrderedDict()

    def add(self, job: Job) -> None:
        """Hold ``job``; 429 when ``max_jobs`` are held and none has ended."""
        self._expire()
        if len(self._jobs) >= self.max_jobs:
            oldest_ended = next((j for j in self._jobs.values() if j.state in ENDED), None)
            if oldest_ended is None:
                raise ApiError(
                    429,
                    f"The gateway holds {self.max_jobs} unfinished jobs; wait for some to end and retry.",
                    "too_many_jobs",
                    retry_after=5,
                )
            del self._jobs[oldest_ended.job_id]
        self._jobs[job.job_id] = job

    def get(self, job_id: str, key_id: str) -> Job | None:
        """The job when ``key_id`` made it; None for another key's, as for an id never given."""
        self._expire()
        job = self._jobs.get(job_id)
        return job if job is not None and job.key_id == key_id else None

    def unfinished(self) -> list[Job]:
        return [job for job in self._jobs.values() if job.state not in ENDED]

    def __len__(self) -> int:
        return len(self._jobs)

    def _expire(self) -> None:
        now = self.clock()
        gone = [
            j.job_id
            for j in self._jobs.values()
            if j.ended_at is not None and now - j.ended_at >= self.kept_s
        ]
        for job_id in gone:
            del self._jobs[job_id]


def new_job(
    key_id: str, model: str, graph: dict[str, Any], workflow: Workflow, served_by: str = "", owner: str = ""
) -> Job:
    """A job of ``key_id`` (sitting at ``owner``) for ``model``, run on ``served_by``'s replicas
    (empty: the model's own)."""
    job_id = "job-" + secrets.token_urlsafe(18)
    return Job(job_id, key_id, model, graph, workflow, int(time.time()), owner, served_by)


class JobFiles(Protocol):
    """Where the files jobs make are kept (``/v1/files``)."""

    async def put(self, job: Job, filename: str, data: bytes) -> MadeFile:
        """Keep ``data`` for the job's key (or its place); the file as the job names it."""
        ...


class MemoryJobFiles:
    """Made files in this gateway's own :class:`FileStore`, readable by the job's key."""

    def __init__(self, store: FileStore) -> None:
        self.store = store

    async def put(self, job: Job, filename: str, data: bytes) -> MadeFile:
        kept = self.store.put(job.key_id, filename, data)
        return MadeFile(kept.file_id, kept.filename, kept.content_type, len(data), data)


@dataclass(frozen=True, slots=True)
class JobSaved:
    """What a record's write found: whether this process still runs the job, and whether its key
    asked (through another process) to cancel it."""

    kept: bool
    cancel_asked: bool = False


class JobRecords(Protocol):
    """Jobs as every process reads them (the control plane's, on the store)."""

    runner: str
    """This process, as a record names who follows a job."""

    async def add(self, job: Job) -> None: ...

    async def save(self, job: Job, ended: bool = False) -> JobSaved: ...

    async def get(self, job_id: str, key_id: str) -> Job | None:
        """The job as last written (None: not ``key_id``'s, or none such)."""
        ...

    async def ask_cancel(self, job_id: str, key_id: str) -> Job | None:
        """Ask the job's runner to cancel it; the job as last written, or None."""
        ...


class JobTaken(Exception):
    """Another process took over the job (this one was silent too long): stop following it."""


class CancelAsked(Exception):
    """The job's key asked to cancel it through another process."""


OnEnded = Callable[[Job], None]
"""Called once when the job's task here ends (also when another process took it: ``Job.taken``)."""


class JobRunner:
    """Runs each job as a task of its own: replica, queue, progress, files."""

    def __init__(
        self,
        settings: GatewaySettings,
        replicas: ReplicaTable,
        finder: ReplicaFinder,
        gate: GateClient,
        files: JobFiles,
        book: JobBook,
        records: JobRecords | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._replicas = replicas
        self._finder = finder
        self._gate = gate
        self._files = files
        self.book = book
        self.records = records
        self._sleep = sleep
        self._clock = clock
        self._recorded: set[str] = set()
        """The jobs this process writes to the records."""

    def start(self, job: Job, on_ended: OnEnded | None = None) -> Job:
        """Hold ``job`` and run it in a task of its own; ``on_ended`` is called when it ends."""
        self.book.add(job)
        job.task = asyncio.get_running_loop().create_task(self._run(job, on_ended), name=job.job_id)
        return job

    async def submit(self, job: Job, on_ended: OnEnded | None = None) -> Job:
        """Start a ``/v1/jobs`` job, recorded first (when there are records) so any process knows it
        before the client is answered."""
        self.book.add(job)
        if self.records is not None:
            await self.records.add(job)
            self._recorded.add(job.job_id)
        job.task = asyncio.get_running_loop().create_task(self._run(job, on_ended), name=job.job_id)
        return job

    def adopt(self, job: Job, on_ended: OnEnded | None = None) -> Job:
        """Carry on a recorded job whose runner died (this process claimed it): followed on its
        replica's gate from its prompt id, or queued when it never was."""
        self.book.add(job)
        self._recorded.add(job.job_id)
        job.task = asyncio.get_running_loop().create_task(self._run(job, on_ended), name=job.job_id)
        return job

    async def get(self, job_id: str, key_id: str) -> Job | None:
        """The job as ``GET /v1/jobs/{id}`` shows it: this process's own if it runs it, else as recorded."""
        job = self.book.get(job_id, key_id)
        if job is None and self.records is not None:
            job = await self.records.get(job_id, key_id)
        return job

    async def cancel_by_id(self, job_id: str, key_id: str) -> Job | None:
        """Cancel the job (here when this process runs it, else through its records); the job."""
        job = self.book.get(job_id, key_id)
        if job is not None and job.task is not None:
            await self.cancel(job)
            return job
        if self.records is None:
            return job
        return await self.records.ask_cancel(job_id, key_id)

    async def cancel(self, job: Job) -> None:
        """Cancel an unfinished job (off the gate's queue, or interrupted) and wait for it to end."""
        if job.state in ENDED or job.task is None:
            return
        job.task.cancel()
        await asyncio.wait({job.task}, timeout=self._settings.connect_timeout_s * 2)

    def close(self) -> None:
        """Stop following every unfinished job (the process ends)."""
        for job in self.book.unfinished():
            if job.task is not None:
                job.task.cancel()

    async def _run(self, job: Job, on_ended: OnEnded | None) -> None:
        endpoint: ReplicaEndpoint | None = None
        taken = False
        try:
            async with asyncio.timeout(self._settings.job_timeout_s):
                endpoint = await self._endpoint(job)
                job.replica_id = endpoint.replica_id
                with self._replicas.acquire(endpoint):
                    await self._follow(job, endpoint)
        except JobTaken:
            taken = job.taken = True
            log.warning("job %s was taken over by another control plane: no longer followed here", job.job_id)
        except (asyncio.CancelledError, CancelAsked) as stopped:
            task = asyncio.current_task()
            if isinstance(stopped, asyncio.CancelledError) and task is not None:
                task.uncancel()
            running = job.state is JobState.RUNNING
            await self._cancel_on_gate(job, endpoint, running)  # "cancelled" once the gate was told
            job.state, job.error = JobState.CANCELLED, "cancelled by its key (DELETE /v1/jobs/{id})"
        except TimeoutError:
            running = job.state is JobState.RUNNING
            limit = self._settings.job_timeout_s
            self._fail(job, f"the workflow did not finish within {limit:g} s (gateway.job_timeout_s)", 504)
            await self._cancel_on_gate(job, endpoint, running)
        except ApiError as error:
            self._fail(job, error.message, error.status)
        except (GateError, MeshError) as error:
            self._fail(job, f"{error}; submit the job again")
        except Exception as error:
            log.exception("job %s failed", job.job_id)
            self._fail(
                job, f"the gateway failed while following the job ({type(error).__name__}); retry", 500
            )
        finally:
            job.ended_at = self.book.clock()
            if not taken:
                await self._write_end(job)
            job.ended.set()
            if on_ended is not None:
                on_ended(job)  # a job taken over ends its ticket here; its usage is the taker's

    async def _write_end(self, job: Job) -> None:
        if self.records is None or job.job_id not in self._recorded:
            return
        self._recorded.discard(job.job_id)
        try:
            await asyncio.shield(self.records.save(job, ended=True))
        except Exception as error:  # the store away: the job ended here all the same
            log.warning("job %s ended %s but could not be recorded: %s", job.job_id, job.state, error)

    async def _endpoint(self, job: Job) -> ReplicaEndpoint:
        """The replica the job runs on: the one it was queued on when it was (adopted), else one
        the router picks."""
        if not job.prompt_id:
            return await self._replica(job.served_by or job.model)
        endpoint = self._replicas.get(job.replica_id)
        if endpoint is None:
            raise GateError(f"replica {job.replica_id}, which ran the job, is gone")
        return endpoint

    @staticmethod
    def _fail(job: Job, why: str, status: int = 502) -> None:
        job.state, job.error, job.status = JobState.FAILED, why, status

    async def _replica(self, model: str) -> ReplicaEndpoint:
        """A ready replica the router would send to, waited for as a chat request waits (finding.py)."""
        table = self._replicas

        async def pick() -> ReplicaEndpoint | None:
            return table.pick(model)

        endpoint = await self._finder.find(model, pick)
        if endpoint is None:
            raise self._finder.not_ready(model)
        return endpoint

    async def _follow(self, job: Job, endpoint: ReplicaEndpoint) -> None:
        gate = self._gate
        if not job.prompt_id:
            job.prompt_id = await gate.queue(endpoint, job.graph)
        last: tuple[Any, ...] = ()
        written_at = -HEARTBEAT_S
        while True:
            progress = await gate.progress(endpoint, job.prompt_id)
            job.follow(progress)
            if job.job_id in self._recorded and (
                job.written() != last or self._clock() - written_at >= HEARTBEAT_S
            ):
                await self._write(job)
                last, written_at = job.written(), self._clock()
            if progress.state == "failed":
                self._fail(job, f"the workflow failed on its replica: {progress.error or 'no reason given'}")
                return
            if progress.state == "done":
                job.files = [await self._fetch(job, endpoint, output) for output in progress.outputs]
                job.state = JobState.DONE
                return
            await self._sleep(self._settings.job_poll_s)

    async def _write(self, job: Job) -> None:
        assert self.records is not None
        try:
            saved = await self.records.save(job)
        except Exception as error:  # the store away: the job goes on, written again at its next change
            log.warning("job %s could not be recorded: %s", job.job_id, error)
            return
        if not saved.kept:
            raise JobTaken(job.job_id)
        if saved.cancel_asked:
            raise CancelAsked(job.job_id)

    async def _fetch(self, job: Job, endpoint: ReplicaEndpoint, output: OutputFile) -> MadeFile:
        data = await self._gate.view(endpoint, output)
        name = output.filename
        if name.lower().endswith(".obj"):
            licence = job.workflow.licence if job.workflow is not None else ""
            data = await asyncio.to_thread(obj_to_glb, data, licence, job.model)
            name = glb_name(name)
        return await self._files.put(job, name, data)

    async def _cancel_on_gate(self, job: Job, endpoint: ReplicaEndpoint | None, running: bool) -> None:
        if endpoint is None or job.prompt_id is None:
            return
        try:
            await self._gate.cancel(endpoint, job.prompt_id, running)
        except GateError as error:
            log.warning("job %s: cancelling on its replica failed: %s", job.job_id, error)
