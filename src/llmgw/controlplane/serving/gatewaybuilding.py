"""The gateway of a control plane or of one of its workers, built in one place from ``server.yaml``.

Both processes serve ``/v1`` from a :class:`~llmgw.gateway.app.Gateway`;
:func:`build_gateway` is the one place either builds one, so that a setting
of ``gateway.*`` reaches every process that serves (a gateway worker's is
built exactly as its control plane's, bar its share of each limit and what
it searches knowledge collections with). Given the client store, the gateway
keeps responses there (:class:`~llmgw.controlplane.serving.responsebook.StoreResponseBook`),
so a follow-up that reaches another process finds them.

What a gateway asks of its leader (a model wanted, a model used, a request's
usage, a replica failed) goes to an :class:`Outbox` built before it: the
follower that carries those requests to the leader (or does them here while
this plane leads) needs the gateway's state, so it is built after the
gateway, and :meth:`Outbox.run` (a supervised component) hands the requests
to it. Before it runs, requests are kept in order (at most
:data:`KEPT_MAX`); a follower keeps them the same way while no leader is
reachable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from starlette.types import ASGIApp

from llmgw.controlplane.config import ServerConfig
from llmgw.controlplane.serving.responsebook import StoreResponseBook
from llmgw.controlplane.statesharing.stateevents import ReplicaFailed, Request, Wanted
from llmgw.core.knowledge import KnowledgeSearch
from llmgw.gateway.app import Gateway
from llmgw.gateway.batch_routes import BatchBook
from llmgw.gateway.file_routes import FileBook
from llmgw.gateway.jobs import JobFiles, JobRecords
from llmgw.gateway.replicas import ReplicaTable
from llmgw.gateway.routing import Router
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.usage import UsageRecord
from llmgw.observability.tracing import Tracing
from llmgw.store.database import Store

log = logging.getLogger(__name__)

KEPT_MAX = 100_000
"""Most requests an :class:`Outbox` keeps before its follower runs; past it the oldest is dropped."""


class LeaderBound(Protocol):
    """Carries a gateway's requests to the leader (``StateFollowing``, ``WorkerFollowing``)."""

    def request(self, request: Request) -> None: ...

    def used(self, model: str) -> None: ...

    def usage(self, record: UsageRecord) -> None: ...


class Outbox:
    """A gateway's requests to its leader, handed to the follower while :meth:`run` runs.

    It is the gateway's :class:`~llmgw.gateway.outbound.GatewayOutbound`: a replica wanted or
    failed goes as a request; usage and the models kept in use go as the follower sums them."""

    def __init__(self) -> None:
        self._to: LeaderBound | None = None
        self._kept: list[Callable[[LeaderBound], None]] = []

    def request(self, request: Request) -> None:
        if self._to is not None:
            self._to.request(request)
        else:
            self._keep(lambda to: to.request(request))

    def used(self, model: str) -> None:
        if self._to is not None:
            self._to.used(model)
        else:
            self._keep(lambda to: to.used(model))

    def usage(self, record: UsageRecord) -> None:
        if self._to is not None:
            self._to.usage(record)
        else:
            self._keep(lambda to: to.usage(record))

    def replica_wanted(self, model: str) -> None:
        self.request(Wanted(model))

    def model_used(self, model: str) -> None:
        self.used(model)

    def replica_failed(self, replica_id: str, reason: str) -> None:
        self.request(ReplicaFailed(replica_id, reason))

    def _keep(self, send: Callable[[LeaderBound], None]) -> None:
        if len(self._kept) >= KEPT_MAX:
            del self._kept[0]
            log.warning("more than %d requests wait for the follower: the oldest was dropped", KEPT_MAX)
        self._kept.append(send)

    async def run(self, to: LeaderBound) -> None:
        """Hand what was kept, then every request as it comes, to ``to`` until cancelled."""
        kept, self._kept = self._kept, []
        for send in kept:
            send(to)
        self._to = to
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self._to = None


def gateway_settings(config: ServerConfig) -> GatewaySettings:
    """The ``/v1`` data path's settings from ``server.yaml``'s ``gateway`` section."""
    g = config.gateway
    return GatewaySettings(
        request_wait_s=g.request_wait_s,
        upstream_timeout_s=g.upstream_timeout_s,
        provider_ca_file=g.provider_ca_file,
        access_log=g.access_log,
        job_poll_s=g.job_poll_s,
        job_timeout_s=g.job_timeout_s,
        jobs_kept=g.jobs_kept,
        job_kept_s=g.job_kept_s,
        files_kept_s=g.files_kept_s,
        files_max_bytes=g.files_max_bytes,
        responses_kept_s=g.responses_kept_s,
        responses_per_key=g.responses_per_key,
        responses_total=g.responses_total,
        fallbacks=g.fallbacks,
        flow=g.flow,
    )


def build_gateway(
    config: ServerConfig,
    leader: Outbox,
    tracing: Tracing,
    *,
    share: float = 1.0,
    knowledge: KnowledgeSearch | None = None,
    knowledge_relay: ASGIApp | None = None,
    files: FileBook | None = None,
    batches: BatchBook | None = None,
    job_files: JobFiles | None = None,
    jobs: JobRecords | None = None,
    clients: Store | None = None,
) -> Gateway:
    """The gateway of control plane ``config.name`` (or of one of its workers).

    ``share``: the part of its plane's share of each rate and concurrency limit it enforces (a
    worker's: ``1 / workers``); ``knowledge``: what it searches knowledge collections with, or
    ``knowledge_relay``: where it passes such requests on (a worker's control plane); ``files``,
    ``batches``: where ``/v1/files`` and ``/v1/batches`` are kept (the client store); ``job_files``,
    ``jobs``: where ComfyUI jobs' files and records are kept; ``clients``: the store as what clients
    make is kept, where responses are kept (None: in the gateway's own memory, seen by no other
    process)."""
    settings = gateway_settings(config)
    responses = None
    if clients is not None:
        responses = StoreResponseBook(
            clients.responses, ttl_s=settings.responses_kept_s, per_key=settings.responses_per_key
        )
    gateway = Gateway(
        settings,
        replicas=ReplicaTable(Router(config.routing)),
        outbound=leader,
        tracing=tracing,
        knowledge=knowledge,
        knowledge_relay=knowledge_relay,
        files=files,
        batches=batches,
        job_files=job_files,
        jobs=jobs,
        responses=responses,
    )
    # the limiter is the gateway's own: its share and plane are set before any limit arrives
    gateway.limiter.share = share
    gateway.limiter.plane = config.name
    return gateway
