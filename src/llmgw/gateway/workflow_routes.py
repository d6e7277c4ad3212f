"""The ComfyUI routes of ``/v1``: pictures, jobs, and the files they made.

::

    POST   /v1/images/generations  OpenAI's images API on a picture model -> 200 {created, data}
    POST   /v1/jobs                {model, inputs} on any workflow model -> 202 {id, state: queued}
    GET    /v1/jobs/{id}           queued (ahead), running (node, step, steps, percent),
                                   done (files with URLs), failed (error), cancelled
    DELETE /v1/jobs/{id}           cancel: off the gate's queue, or interrupted
    GET    /v1/files/{id}          a made file's bytes (``file_routes.py``)

Jobs and files belong to the key that made them: to any other key they
answer 404 as ids never given. Usage is counted per request: an images
request counts its ``n`` pictures, a job 1, as completion units.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from llmgw.gateway import metrics
from llmgw.gateway.access import Access, model_not_found
from llmgw.gateway.api_errors import ApiError, allow_only, send_bytes
from llmgw.gateway.bodies import model_and_stream, read_body
from llmgw.gateway.catalog_view import GatewayCatalog
from llmgw.gateway.exchange import CLIENT_CLOSED, Exchange, send_json
from llmgw.gateway.images import graphs_for, images_body, parse_images
from llmgw.gateway.jobs import Job, JobRunner, JobState, new_job
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.limiting import Limiter, Ticket
from llmgw.gateway.outbound import Telling
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.usage import UsageRecord
from llmgw.gateway.workflows import Workflow

IMAGES = "/v1/images/generations"
JOBS = "/v1/jobs"
FILES = "/v1/files"


def workflow_route(path: str) -> bool:
    """Whether ``path`` is one of these routes."""
    return path in (IMAGES, JOBS) or path.startswith(JOBS + "/")


def _files_url(scope: Scope) -> str:
    """Where this gateway answers ``/v1/files``, as the client reached it."""
    host = next((v.decode("latin-1") for n, v in scope["headers"] if n == b"host"), "")
    if not host and scope.get("server"):
        address, port = scope["server"]
        host = f"{address}:{port}"
    root: str = scope.get("root_path", "")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    return f"{scope.get('scheme', 'http')}://{host}{root}{FILES}"


def _owner(key: KeyEntry) -> str:
    """Where a key's jobs' files belong: its place, as text."""
    return str(key.place.at)


def _end(ticket: Ticket | None, units: int) -> None:
    """The request (or its job) ended having made ``units``: its ticket ends (once)."""
    if ticket is not None:
        ticket.end(units, 0.0 if ticket.price is None else ticket.price.cost(0, 0, pictures=units))


def _status_of(job: Job) -> int:
    if job.state is JobState.DONE:
        return 200
    if job.state is JobState.CANCELLED:
        return CLIENT_CLOSED
    return job.status


async def _all_ended(jobs: list[Job], receive: Receive) -> bool:
    """Wait for every job to end; False when the client went away first."""
    waiting: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(job.ended.wait() for job in jobs)))
    gone: asyncio.Future[Any] = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((waiting, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not waiting.done():
            waiting.cancel()
    return waiting.done() and not waiting.cancelled()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class WorkflowRoutes:
    """Answers the routes :func:`workflow_route` names, from the gateway's parts."""

    def __init__(
        self,
        settings: GatewaySettings,
        access: Access,
        catalog: GatewayCatalog,
        limiter: Limiter,
        jobs: JobRunner,
        telling: Telling,
    ) -> None:
        self.settings = settings
        self.access = access
        self.catalog = catalog
        self.limiter = limiter
        self.jobs = jobs
        self.telling = telling

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        path: str,
        authorization: bytes | None,
        length: bytes | None,
    ) -> None:
        """Answer one request to a route :func:`workflow_route` names (``path``: as ``/v1/...``)."""
        method: str = scope["method"]
        key = exchange.key = self.access.authenticate(authorization)
        self.limiter.refuse_expired(key)  # an expired key reads and cancels no job either
        if path in (IMAGES, JOBS):
            allow_only(method, path, "POST")
            body = await read_body(receive, length, self.settings.max_body_bytes)
            if body is None:
                exchange.status = CLIENT_CLOSED
                return
            facts = model_and_stream(body)
            workflow, served_by = self._workflow(key, facts.model, path)
            exchange.model = facts.model
            data = facts.data or {}
            if path == IMAGES:
                await self._images(scope, receive, send, exchange, key, (workflow, served_by), data)
            else:
                await self._job(send, exchange, key, (workflow, served_by), data)
        elif path.startswith(JOBS + "/"):
            allow_only(method, path, "GET", "DELETE")
            job_id = path[len(JOBS) + 1 :]
            if method == "DELETE":
                job = await self.jobs.cancel_by_id(job_id, key.key_id)
            else:
                job = await self.jobs.get(job_id, key.key_id)
            if job is None:
                raise ApiError(
                    404,
                    f"The job '{path[len(JOBS) + 1 :]}' does not exist (or has expired); "
                    "POST /v1/jobs makes one.",
                    "job_not_found",
                )
            await send_json(send, exchange, 200, job.as_json(_files_url(scope)))

    def _workflow(self, key: KeyEntry, model: str, path: str) -> tuple[Workflow, str]:
        """The model's workflow and the model whose replicas run it (an environment's entry for a
        member, else itself) when ``key`` sees the model and it serves ``path``; else 404 or 400."""
        if not self.access.visible(model, key):
            raise model_not_found(model)
        self.access.check_task(model, path)
        entry = self.catalog.get(model)
        if entry is None or entry.workflow is None:
            raise ApiError(
                503,
                f"The model '{model}' has no workflow the gateway can read.",
                "workflow_missing",
                "model",
                hint="an administrator checks the model's comfyui section "
                "(`llmgw ctl models --json` shows its definition)",
            )
        return entry.workflow, entry.served_by or model

    def _report(
        self, key: KeyEntry, model: str, replica_id: str, units: int, status: int, started: float
    ) -> None:
        duration = time.perf_counter() - started
        record = UsageRecord(
            key.key_id,
            model,
            replica_id,
            0,
            units,
            status,
            duration,
            metrics.project_of(key),
            generation_s=duration,
            cost=self.limiter.prices.cost(model, 0, 0, pictures=units),
        )
        self.telling.request_ended(record)

    async def _job(
        self,
        send: Send,
        exchange: Exchange,
        key: KeyEntry,
        run: tuple[Workflow, str],
        data: dict[str, Any],
    ) -> None:
        workflow, served_by = run
        inputs = data.get("inputs", {})
        if not isinstance(inputs, dict):
            raise ApiError(
                400, "'inputs' must be an object of input name -> value.", "invalid_inputs", "inputs"
            )
        model = exchange.model
        graph = workflow.filled(inputs, model)
        ticket = self.limiter.admit(key, model)
        started = time.perf_counter()

        def ended(job: Job) -> None:
            _end(ticket, 1 if job.state is JobState.DONE else 0)
            if job.replica_id and not job.taken:  # a job taken over is counted where it ends
                self._report(key, model, job.replica_id, 1, _status_of(job), started)

        try:
            job = await self.jobs.submit(
                new_job(key.key_id, model, graph, workflow, served_by, _owner(key)), ended
            )
        except BaseException:  # never started: its ticket ends here, as a job's does when it ends
            _end(ticket, 0)
            raise
        answer = {
            "id": job.job_id,
            "object": "job",
            "model": model,
            "created_at": job.created_at,
            "state": "queued",
        }
        await send_json(send, exchange, 202, answer)

    async def _images(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        key: KeyEntry,
        run: tuple[Workflow, str],
        data: dict[str, Any],
    ) -> None:
        workflow, served_by = run
        model = exchange.model
        request = parse_images(model, data)
        graphs = graphs_for(request, workflow)
        ticket = self.limiter.admit(key, model)
        started = time.perf_counter()
        jobs: list[Job] = []
        status = CLIENT_CLOSED
        try:
            jobs = [
                self.jobs.start(new_job(key.key_id, model, graph, workflow, served_by, _owner(key)))
                for graph in graphs
            ]
            if not await _all_ended(jobs, receive):
                for job in jobs:
                    await self.jobs.cancel(job)
                return
            failed = next((job for job in jobs if job.state is not JobState.DONE), None)
            if failed is not None:
                status = _status_of(failed)
                retry_after = self.settings.retry_after_s if status == 503 else None
                raise ApiError(
                    status,
                    f"The picture could not be made: {failed.error}",
                    "image_failed",
                    retry_after=retry_after,
                )
            pictures = [job.files[0] for job in jobs if job.files]
            if len(pictures) < len(jobs):
                status = 502
                raise ApiError(502, f"The model '{model}' finished without saving a picture.", "image_failed")
            status = 200
            body = images_body(pictures, request.response_format, _files_url(scope))
            exchange.status, exchange.response_started = 200, True
            await send_bytes(send, 200, body, exchange.request_id)
        finally:
            _end(ticket, request.n if status == 200 else 0)
            for (
                job
            ) in jobs:  # a job started is cancelled if the request ends first (a client gone, a shutdown)
                if (
                    job.state not in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)
                    and job.task is not None
                ):
                    job.task.cancel()
            replica_id = next((job.replica_id for job in jobs if job.replica_id), "")
            if replica_id:
                self._report(key, model, replica_id, request.n if status == 200 else 0, status, started)
