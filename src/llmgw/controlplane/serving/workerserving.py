"""One gateway worker process (``llmgw server worker``): ``/v1`` from its own gateway, the rest handed on.

A worker builds a :class:`~llmgw.gateway.app.Gateway` of its own, exactly as
its control plane builds its own
(:func:`~llmgw.controlplane.serving.gatewaybuilding.build_gateway`: every
``gateway.*`` setting), fed by its control plane over the local channel
(:class:`~llmgw.controlplane.statesharing.localchannel.WorkerFollowing`), binds the HTTP
port with ``SO_REUSEPORT`` beside the other workers and serves it with the
same guarded protocol and connection limits as the control plane (``http.*``,
per worker). It answers:

- ``/v1`` (and ``/rerank``) itself while its control plane serves ``/v1``
  (it leads, or is a standby holding the leader's copy) and it holds a full
  copy; each answer carries ``x-llmgw-worker: <pid>``;
- everything else (``/api``, the portal, ``/metrics``, ``/healthz``,
  ``/leader``, ``/v1`` while its plane does not serve it, and ``/v1``
  requests naming an adapter loaded at run time, which its plane decides
  alone, and ``/v1`` requests that search knowledge collections, which its
  plane searches: docs/knowledge.md) by passing the
  request on, streamed both ways, to the control plane's HTTP listener on its
  Unix socket (``http.sock`` in the data dir, 0600), which answers exactly
  as it would on the port.

Its usage, on-demand wants and unreachable replicas go to the control plane
over the channel; its limiter holds ``1 / workers`` of each rate and
concurrency limit (docs/tenancy.md). It stops on a stop signal (SIGTERM, SIGINT, SIGHUP) or once
its parent (the control plane) is gone.

It is run by :func:`~llmgw.runtime.processes.run_process`: :func:`build_worker`
builds its parts, :func:`serve_worker` runs them, as components of its
supervisor:

===================  ========  ==============================================
component            policy    what
===================  ========  ==============================================
``http``             FATAL     ``/v1`` on the shared port, the rest passed on
``local-channel``    RESTART   the control plane's state in, requests out
``load-reader``      RESTART   engines' load into the router
``leader-requests``  RESTART   the gateway's requests handed to the channel
===================  ========  ==============================================
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from llmgw.controlplane.config import ServerConfig
from llmgw.controlplane.metrics.workermetrics import gateway_samples
from llmgw.controlplane.serving.batchbook import StoreBatchBook
from llmgw.controlplane.serving.clientstore import open_client_store
from llmgw.controlplane.serving.filebook import FileSettings, MirrorFileBook
from llmgw.controlplane.serving.gatewaybuilding import Outbox, build_gateway
from llmgw.controlplane.serving.httpserving import ASGIApp, HttpServer, reuse_port_socket
from llmgw.controlplane.serving.jobrecords import FileBookJobFiles, StoreJobRecords, runner_name
from llmgw.controlplane.serving.relaying import LeaderDecides
from llmgw.controlplane.serving.workers import worker_count
from llmgw.controlplane.statesharing.gatewaystate import GatewayState
from llmgw.controlplane.statesharing.localchannel import SOCKET_NAME, WorkerFollowing
from llmgw.controlplane.statesharing.statestream import RuntimeAdapters
from llmgw.gateway.app import Gateway
from llmgw.gateway.paths import gateway_path
from llmgw.mirror.blobs import BlobStore
from llmgw.observability.tracing import Tracing
from llmgw.runtime.processes import Process, run_process
from llmgw.runtime.supervising import Policy
from llmgw.store.database import Store

log = logging.getLogger(__name__)

HTTP_SOCKET_NAME = "http.sock"
"""The control plane's HTTP listener behind its workers, in its data dir."""
WORKER_HEADER = b"x-llmgw-worker"
PARENT_CHECK_S = 0.5
_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"te", b"trailer"}


def _unavailable(error: Exception) -> bytes:
    return json.dumps(
        {
            "error": {
                "message": f"this gateway worker cannot reach its control plane ({error})",
                "hint": "try again shortly; if it lasts, read the control plane's log (it may be restarting)",
                "type": "service_unavailable",
            }
        }
    ).encode()


class PassOn:
    """ASGI: a request passed on, streamed both ways, to the HTTP server on a Unix socket."""

    def __init__(self, path: Path) -> None:
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(path)),
            timeout=httpx.Timeout(None, connect=5.0),
            # event streams (/api/events) hold their connection as long as they last: no pool cap,
            # so they never keep other requests waiting (the control plane bounds its connections)
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        disconnected = asyncio.Event()

        async def body() -> Any:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected.set()
                    return
                yield message.get("body", b"")
                if not message.get("more_body"):
                    return

        target = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        if client := scope.get("client"):
            headers.append((b"x-forwarded-for", str(client[0]).encode()))
        request = self._client.build_request(
            scope["method"], "http://llmgw" + target, headers=headers, content=body()
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as error:
            answer = _unavailable(error)
            head = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
            await send({"type": "http.response.start", "status": 503, "headers": head})
            await send({"type": "http.response.body", "body": answer})
            return
        try:
            out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            streaming = asyncio.ensure_future(self._stream(response, send))
            watching = asyncio.ensure_future(self._watch(receive, disconnected))
            try:
                await asyncio.wait({streaming, watching}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (streaming, watching):
                    task.cancel()
                await asyncio.wait({streaming, watching})
            if streaming.done() and not streaming.cancelled() and streaming.exception() is None:
                await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    @staticmethod
    async def _stream(response: httpx.Response, send: Any) -> None:
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

    @staticmethod
    async def _watch(receive: Any, disconnected: asyncio.Event) -> None:
        """Returns once the client went away (an event stream then ends here too)."""
        while not disconnected.is_set():
            if (await receive())["type"] == "http.disconnect":
                return


async def _read_body(receive: Any, limit: int) -> tuple[list[Any], bytes | None]:
    """The request's first messages and its whole body (None: longer than ``limit``, or the client
    went away: then the messages end with ``http.disconnect``)."""
    messages: list[Any] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] == "http.disconnect":
            return messages, None
        size += len(message.get("body", b""))
        if size > limit:
            return messages, None
        if not message.get("more_body"):
            return messages, b"".join(m.get("body", b"") for m in messages)


def _replaying(messages: list[Any], receive: Any) -> Any:
    """``receive`` that gives ``messages`` again first."""
    waiting = list(messages)

    async def replay() -> Any:
        return waiting.pop(0) if waiting else await receive()

    return replay


def worker_app(
    gateway: ASGIApp, other: ASGIApp, serves: Callable[[], bool], decides: LeaderDecides | None = None
) -> ASGIApp:
    """``/v1`` to ``gateway`` (tagged with this pid) while ``serves()``; everything else to ``other``.

    ``decides``: the ``/v1`` requests left to the control plane all the same (those naming an adapter
    loaded at run time, so that one process alone decides where adapters load), as a standby leaves
    them to the leader."""
    tag = (WORKER_HEADER, str(os.getpid()).encode())

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and gateway_path(scope["path"]) and serves():

            async def tagged(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", ()), tag]}
                await send(message)

            if scope["method"] == "POST" and decides is not None and decides.peek():
                messages, body = await _read_body(receive, decides.body_max)
                receive = _replaying(messages, receive)
                if body is None or decides.named_in(body):
                    await other(scope, receive, send)
                    return
            await gateway(scope, receive, tagged)
        else:
            await other(scope, receive, send)

    return app


async def _parent_gone(parent: int) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(PARENT_CHECK_S)
    log.warning("the control plane (pid %d) is gone: this gateway worker stops", parent)


@dataclass(frozen=True)
class WorkerParts:
    """What a gateway worker serves with, built once by :func:`build_worker`."""

    name: str
    index: int
    port: int
    clients: Store
    """The store as what its clients make is kept (``clientstore.py``)."""
    gateway: Gateway
    outbox: Outbox
    following: WorkerFollowing
    http: HttpServer


async def build_worker(config: ServerConfig, port: int, index: int, process: Process) -> WorkerParts:
    """Worker ``index``'s parts, in order: the store as what its clients make is kept, its gateway
    (built as its control plane's is), its copy of the control plane's state, its HTTP server on
    ``port`` (``SO_REUSEPORT``)."""
    workers = worker_count(config.gateway.workers)
    tracing = Tracing.from_settings(config.tracing, f"llmgw-server {config.name} worker {index}")
    process.closing.callback(tracing.shutdown)
    clients = await open_client_store(config, process.closing)
    pass_on = PassOn(config.data_path / HTTP_SOCKET_NAME)
    process.closing.push_async_callback(_closed_quietly, pass_on)
    outbox = Outbox()
    # the search runs in the control plane: such a request is answered there
    # files and batches on the client store, the files' bytes in the plane's own mirror folder
    files = MirrorFileBook(
        clients, BlobStore(config.data_path / "mirror"), None, FileSettings.of(config.files)
    )
    gateway = build_gateway(
        config,
        outbox,
        tracing,
        share=1.0 / workers,
        knowledge_relay=pass_on,
        files=files,
        batches=StoreBatchBook(clients.batches, files),
        job_files=FileBookJobFiles(files, config.gateway.files_kept_s),
        jobs=StoreJobRecords(clients, runner_name(config.name, index)),
        clients=clients,
    )
    process.closing.push_async_callback(gateway.close)
    following = WorkerFollowing(
        GatewayState(gateway.feed),
        gateway.limiter,
        config.data_path / SOCKET_NAME,
        models=gateway.replicas.models,
        metrics=gateway_samples,
        queued=gateway.finder.queues,
        elsewhere=gateway.finder.elsewhere,
    )
    decides = RuntimeAdapters(gateway.adapters, gateway.settings.max_body_bytes)
    app = worker_app(gateway.asgi_app(), pass_on, lambda: following.serves, decides)
    http = HttpServer(app, config.http, reuse_port_socket(config.http.host, port))
    return WorkerParts(config.name, index, port, clients, gateway, outbox, following, http)


async def _closed_quietly(pass_on: PassOn) -> None:
    with contextlib.suppress(Exception):
        await pass_on.close()


async def serve_worker(parts: WorkerParts, process: Process) -> None:
    """Serve until stopped or the control plane is gone, then finish the requests in flight."""
    supervisor = process.supervisor
    supervisor.add("http", parts.http.serve_until_stopped, Policy.FATAL)
    supervisor.add("local-channel", parts.following.run)
    supervisor.add("load-reader", parts.gateway.loads.run)
    supervisor.add("leader-requests", lambda: parts.outbox.run(parts.following))
    host = parts.http.config.host
    log.info("gateway worker %d (pid %d) serving on %s:%d", parts.index, os.getpid(), host, parts.port)
    stopping = asyncio.create_task(process.stop.wait(), name="stop")
    orphaned = asyncio.create_task(_parent_gone(os.getppid()), name="parent-gone")
    try:
        await asyncio.wait({stopping, orphaned}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (stopping, orphaned):
            task.cancel()
    await parts.http.stop()


async def run_worker(config: ServerConfig, port: int, index: int) -> None:
    """Serve as worker ``index`` on ``port`` until a stop signal or the control plane is gone."""
    await run_process(lambda process: build_worker(config, port, index, process), serve_worker)
