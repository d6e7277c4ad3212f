"""The control plane's parts, built once each in dependency order (:func:`build`), and the
components it runs (:func:`add_components`).

::

    store, mirror, usage, tracing -> the HTTP port (bound) -> knowledge -> gateway
          -> leadership, the state to and from the other planes -> fleet, reconciler
          -> keys, agents' sessions, mirror replication -> leader duties -> admin API
          -> the agents' server, the HTTP server (and the gateway workers behind it)

Each part is handed what it needs when it is built: no part refers to one
built after it, and none is changed after construction. Where two need each
other, the one built first is handed the other when it runs: the gateway's
requests to the leader wait in an :class:`~llmgw.controlplane.serving.gatewaybuilding.Outbox`
until ``leader-requests`` hands them to the follower (built after the
gateway, whose state it keeps); leadership is told where this process is
reached and what fills the leader's memory
(:meth:`ControlPlaneParts.prepare_to_lead`) when ``leadership`` runs. The
HTTP port is bound before anything naming it is built. The gateway is fed
through its one inbound interface (``gateway.feed``). Every long-lived task
runs in the process :class:`~llmgw.runtime.supervising.Supervisor` (the
process itself: :mod:`llmgw.runtime.processes`):

=====================  ========  =================================================
component              policy    what
=====================  ========  =================================================
``http``               FATAL     ``/v1``, ``/api``, portal, ``/metrics``, ``/leader``
                                 (behind gateway workers: on ``http.sock``)
``metrics-http``       FATAL     ``/metrics`` without a token on ``http.metrics_address``
                                 (only when set)
``workers``            RESTART   gateway worker processes (``gateway.workers``
                                 above 1), each restarted with backoff
``worker-channel``     RESTART   the gateway's state to the workers, their usage
                                 back (the local channel)
``retire-workers``     RESTART   after a restart: the workers of the previous start
                                 stopped once this start's own serve (then it ends)
``leader-requests``    RESTART   the gateway's requests (wanted, used, usage, failed
                                 replicas, limit counts) handed to the follower
``load-reader``        RESTART   engines' load into the router
``usage-writer``       RESTART   usage sums into the store
``limit-counts``       RESTART   tokens counted against budgets into the store
``limit-sharing``      RESTART   the leader divides rate and concurrency limits
                                 between the planes serving /v1 (every second)
``callers``            RESTART   users' tokens and roles reloaded for ``/api``
``reconciler``         RESTART   leader only (started by ``leader-duties``)
``training``           RESTART   leader only: training jobs onto nodes (started by
                                 ``leader-duties``)
``response-sweeper``   RESTART   leader only: kept responses expired or past
                                 ``gateway.responses_total`` removed (every 30 s)
``leader-duties``      RESTART   starts/stops the leader-only components as
                                 leadership changes
``mirror-replicator``  RESTART   pulls the blobs this plane lacks from its peers
                                 (every plane, leading or not: docs/mirror.md)
``batches``            RESTART   leader only: carries every batch on through the
                                 gateway (docs/batches.md)
``file-expiry``        RESTART   leader only: deletes the files past their expiry
                                 (docs/files.md)
``job-pickup``         RESTART   leader only: follows the ComfyUI jobs whose process
                                 died, forgets the long ended (docs/comfyui-api.md)
``state-following``    RESTART   a standby's copy of the leader's gateway state,
                                 its requests to the leader
``inherited-replicas`` RESTART   a new leader drops the replicas of the old one's
                                 stream that no node reports within the grace
``leadership``         RESTART   added by :mod:`~llmgw.controlplane.running` once
                                 the HTTP server listens
``firewall``           RESTART   llmgw's nftables table (C10.2), also added once
                                 the HTTP server listens
=====================  ========  =================================================
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.config import ServerConfig
from llmgw.controlplane.lifecycle.leaderduties import LeaderDuties
from llmgw.controlplane.lifecycle.leadership import Leadership
from llmgw.controlplane.nodes.agentsettings import SettingsCheck, forbidden_only
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.parts import (
    LEADER_ONLY,
    ClientData,
    Foundation,
    Leading,
    Listening,
    Nodes,
    Replicas,
    build_admin,
    build_client_data,
    build_edges,
    build_foundation,
    build_http,
    build_leading,
    build_lease,
    build_metrics_http,
    build_nodes,
    build_replicas,
    build_worker_channel,
    knowledge_search,
    listen,
    record_vip,
)
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.controlplane.serving.batching import BatchRunner, BatchSettings
from llmgw.controlplane.serving.gatewaybuilding import Outbox, build_gateway
from llmgw.controlplane.serving.httpserving import HttpServer
from llmgw.controlplane.serving.jobrecords import JobPickup
from llmgw.controlplane.serving.responsebook import ResponseSweeper
from llmgw.controlplane.serving.workers import WorkerSupervisor, retire, worker_count
from llmgw.controlplane.statesharing.localchannel import (
    SOCKET_NAME,
    WorkerChannelServer,
)
from llmgw.controlplane.statesharing.statestream import (
    drop_inherited,
)
from llmgw.core.knowledge import KnowledgeSearch
from llmgw.gateway.app import Gateway
from llmgw.gateway.queueing import summed
from llmgw.knowledge.service import Knowledge, knowledge_for, own_url
from llmgw.protocol.grpc_transport import AgentServer
from llmgw.runtime.processes import Process
from llmgw.runtime.supervising import Policy, Supervisor
from llmgw.store.database import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControlPlaneParts:
    """Every part of one control plane, built once each by :func:`build`."""

    config: ServerConfig
    base: Foundation
    listening: Listening
    knowledge: Knowledge
    outbox: Outbox
    """The gateway's requests to the leader, handed to ``leading.following`` while it runs."""
    data: ClientData
    gateway: Gateway
    batches: BatchRunner
    """A leader duty: carries every batch on through the gateway."""
    pickup: JobPickup
    """A leader duty: takes over the ComfyUI jobs whose process died."""
    sweeper: ResponseSweeper
    """Removes kept responses expired or past ``gateway.responses_total`` (while leading)."""
    leading: Leading
    replicas: Replicas
    nodes: Nodes
    duties: LeaderDuties
    admin: AdminApi
    agent_server: AgentServer
    http: HttpServer
    channel: WorkerChannelServer | None
    workers: WorkerSupervisor | None
    """The gateway workers serving /v1 on the HTTP port (``gateway.workers`` above 1), else None."""
    metrics_http: HttpServer | None
    """``/metrics`` without a token on ``http.metrics_address`` (None: unset)."""

    @property
    def store(self) -> Store:
        return self.base.store

    @property
    def leadership(self) -> Leadership:
        return self.leading.leadership

    @property
    def sessions(self) -> NodeSessions:
        return self.nodes.sessions

    @property
    def reconciler(self) -> Reconciler:
        return self.replicas.reconciler

    async def prepare_to_lead(self) -> None:
        """Fill what the leader keeps in memory (keys, catalog, replicas placed) before it serves, and
        take over what the last leader had under way (replicas draining, adapter rolls, the agents'
        rollout)."""
        await self.nodes.keys.reload()
        await self.replicas.reconciler.take_over()
        await self.nodes.upgrades.take_over()
        await record_vip(self.store, self.config.name, self.config.leadership.vip)


async def build(
    config: ServerConfig,
    process: Process,
    *,
    check_agent_settings: SettingsCheck = forbidden_only,
    worker_log_args: Sequence[str] = (),
    knowledge: KnowledgeSearch | None = None,
) -> ControlPlaneParts:
    """Build every part in dependency order; ``process.closing`` closes them (in reverse) when it ends.

    ``worker_log_args``: how gateway workers log (``--log-level``, ``--log-json``), if there are any.
    ``knowledge``: what the gateway searches knowledge collections with; None: the cluster's own
    search (:func:`knowledge_search`)."""
    closing = process.closing
    base = await build_foundation(config, closing)
    listening = listen(config, worker_count(config.gateway.workers), closing)
    # embeds through this plane's own /v1 (docs/knowledge.md)
    kb = knowledge_for(
        base.store, config.admin_token_sha256, partial(own_url, config.http.host, listening.port)
    )
    closing.push_async_callback(kb.close)
    outbox = Outbox()
    search = knowledge if knowledge is not None else knowledge_search(kb)
    leadership = build_lease(config, base, closing)
    data = build_client_data(config, base, leadership)
    gateway = build_gateway(
        config,
        outbox,
        base.tracing,
        knowledge=search,
        files=data.files,
        batches=data.batches,
        job_files=data.job_files,
        jobs=data.job_records,
        clients=base.clients,
    )
    closing.push_async_callback(gateway.close)
    batches = batch_runner(config, base, data, gateway)
    pickup = JobPickup(
        base.clients,
        gateway,
        data.job_records.runner,
        orphan_s=config.gateway.job_orphan_s,
        kept_s=config.gateway.job_kept_s,
    )
    sweeper = ResponseSweeper(base.store.responses, config.gateway.responses_total)
    leading = build_leading(config, base, leadership, gateway, outbox, closing)
    replicas = build_replicas(config, base, gateway)
    nodes = await build_nodes(config, base, gateway, leading, replicas, closing)
    duties = LeaderDuties(leadership, process.supervisor, nodes.sessions, LEADER_ONLY)
    admin = build_admin(
        config, (base, data, leading, replicas, nodes), kb, check_agent_settings, process.supervisor
    )
    admin.state.provider_health = lambda: gateway.providers.health
    admin.state.queues = lambda: summed(gateway.finder.queues(), replicas.worker_loads.queues())
    agent_server, edge = build_edges(config, (base, gateway, leading, replicas, nodes), admin, closing)
    channel = build_worker_channel(listening, gateway, leading, replicas)
    http, workers = build_http(config, listening, edge, channel, worker_log_args, nodes.callers)
    return ControlPlaneParts(
        config, base, listening, kb, outbox, data, gateway, batches, pickup, sweeper, leading, replicas,
        nodes, duties, admin, agent_server, http, channel, workers, build_metrics_http(config, channel),
    )  # fmt: skip


def batch_runner(config: ServerConfig, base: Foundation, data: ClientData, gateway: Gateway) -> BatchRunner:
    """The leader's runner of batches: each request through ``gateway`` as the batch's key."""
    clients = base.clients
    return BatchRunner(
        clients.batches,
        data.files,
        gateway.asgi_app(),
        gateway.keys,
        gateway.replicas,
        clients.now,
        BatchSettings.of(config.batches),
        gateway.loads,
    )


def add_components(parts: ControlPlaneParts, supervisor: Supervisor) -> None:
    """Register every component of the table above but those that join once the HTTP server listens
    (``leadership``, ``firewall``: :mod:`~llmgw.controlplane.running`)."""
    config, leading, replicas, nodes = parts.config, parts.leading, parts.replicas, parts.nodes
    leadership, following, state = leading.leadership, leading.following, leading.state
    if parts.workers is not None and parts.channel is not None:
        channel, pool = parts.channel, parts.workers
        supervisor.add("worker-channel", lambda: channel.run(config.data_path / SOCKET_NAME))
        supervisor.add("workers", pool.run)
        inherited = parts.listening.inherited
        if inherited is not None:
            supervisor.add("retire-workers", lambda: retire(inherited[1], partial(_own_workers_serve, parts)))
    supervisor.add("http", parts.http.serve_until_stopped, Policy.FATAL)
    if parts.metrics_http is not None:
        supervisor.add("metrics-http", parts.metrics_http.serve_until_stopped, Policy.FATAL)
    supervisor.add("leader-requests", lambda: parts.outbox.run(following))
    supervisor.add("load-reader", parts.gateway.loads.run)
    supervisor.add("usage-writer", parts.base.usage.run)
    supervisor.add("limit-counts", leading.counts.run)
    supervisor.add("limit-sharing", leading.sharing.run)
    supervisor.add("callers", lambda: nodes.callers.keep_loaded(parts.store))
    supervisor.add(
        "reconciler", lambda: replicas.reconciler.run(may_act=lambda: leadership.leading), start=False
    )
    supervisor.add("training", replicas.training.run, start=False)
    supervisor.add("response-sweeper", parts.sweeper.run, start=False)
    supervisor.add("leader-duties", parts.duties.follow)
    supervisor.add("mirror-replicator", parts.data.replicator.run)
    supervisor.add("batches", parts.batches.run, start=False)
    supervisor.add("file-expiry", parts.data.file_expiry.run, start=False)
    supervisor.add("job-pickup", parts.pickup.run, start=False)
    supervisor.add("state-following", following.run)
    fleet, grace_s = replicas.fleet, config.reconcile.node_grace_s
    supervisor.add(
        "inherited-replicas", lambda: drop_inherited(state, leadership, lambda: set(fleet.replicas), grace_s)
    )


def _own_workers_serve(parts: ControlPlaneParts) -> bool:
    """Whether this start's own workers all serve (the previous start's may then be retired)."""
    assert parts.workers is not None and parts.channel is not None
    mine = set(parts.workers.pids.values())
    serving = set(parts.channel.pids.values())
    live = parts.leadership.serving or parts.leading.following.live
    return len(mine) == parts.workers.count and mine <= serving and live
