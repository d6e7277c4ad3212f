"""The control plane's parts, built once each in dependency order, with every long-lived one supervised.

::

    store -> demand, usage -> gateway -> fleet -> reconciler -> leadership
          -> agents' sessions -> leader duties -> admin API -> servers (HTTP, agents)

Each part is handed what it needs when it is built: no part refers to one
built after it, and none is changed after construction. The gateway is fed
through its one inbound interface (``gateway.feed``). Every long-lived task
runs in the process :class:`~llmgw.runtime.supervising.Supervisor`:

=================  ========  =================================================
component          policy    what
=================  ========  =================================================
``http``           FATAL     ``/v1``, ``/api``, portal, ``/metrics``, ``/leader``
                             (behind gateway workers: on ``http.sock``)
``workers``        RESTART   gateway worker processes (``gateway.workers``
                             above 1), each restarted with backoff
``worker-channel`` RESTART   the gateway's state to the workers, their usage
                             back (the local channel)
``load-reader``    RESTART   engines' load into the router
``usage-writer``   RESTART   usage sums into the store
``limit-counts``   RESTART   tokens counted against budgets into the store
``retire-workers`` RESTART   after a restart: the workers of the previous start
                             stopped once this start's own serve (then it ends)
``limit-sharing``  RESTART   the leader divides rate and concurrency limits
                             between the planes serving /v1 (every second)
``callers``        RESTART   users' tokens and roles reloaded for ``/api``
``leader-duties``  RESTART   starts/stops the reconciler as leadership changes
``mirror-``        RESTART   pulls the blobs this plane lacks from its peers
``replicator``               (every plane, leading or not: docs/mirror.md)
``reconciler``     RESTART   leader only (started by ``leader-duties``)
``leadership``     RESTART   added by :mod:`~llmgw.controlplane.running` once
                             the HTTP port is known
``firewall``       RESTART   llmgw's nftables table (C10.2), also added once
                             the ports are known
=================  ========  =================================================
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import REGISTRY

from llmgw.controlplane.admin import AdminApi
from llmgw.controlplane.admission import Admission
from llmgw.controlplane.agentsettings import SettingsCheck, SettingsPush
from llmgw.controlplane.blobaccess import BlobAccess
from llmgw.controlplane.callers import Callers
from llmgw.controlplane.clustermetrics import observe_pass, register_cluster, watch_store
from llmgw.controlplane.config import ServerConfig, save_server_config
from llmgw.controlplane.demand import ModelDemand
from llmgw.controlplane.fleet import Fleet, ReplicaState
from llmgw.controlplane.gateway_outbound import FollowerOutbound
from llmgw.controlplane.gatewaystate import GatewayState
from llmgw.controlplane.gpu_history import GpuHistory
from llmgw.controlplane.httpserving import ASGIApp, HttpServer, reuse_port_socket, route_by_prefix
from llmgw.controlplane.leaderduties import LeaderDuties
from llmgw.controlplane.leadership import Identity, Leadership
from llmgw.controlplane.limit_counting import LimitCounts
from llmgw.controlplane.limit_sharing import LimitSharing
from llmgw.controlplane.localchannel import (
    SOCKET_NAME,
    WorkerChannelServer,
    WorkerLoads,
    private_unix_socket,
)
from llmgw.controlplane.mirror_replicating import MirrorReplicator
from llmgw.controlplane.reconciling import Reconciler
from llmgw.controlplane.relaying import RELAY_CONNECT_S, RelayAnswering, StandbyForwarding
from llmgw.controlplane.selfrestart import inherited_socket, inherited_workers
from llmgw.controlplane.sessions import NodeSessions
from llmgw.controlplane.statestream import (
    RuntimeAdapters,
    StateFollowing,
    StateServing,
    drop_inherited,
    request_dispatcher,
)
from llmgw.controlplane.training import TrainingScheduler
from llmgw.controlplane.upgrading import AgentUpgrades
from llmgw.controlplane.usage_spilling import UsageSpill
from llmgw.controlplane.usage_writing import UsageWriter
from llmgw.controlplane.workermetrics import SummedRegistry, serve_metrics
from llmgw.controlplane.workers import WorkerSupervisor, retire, subprocess_launcher, worker_count
from llmgw.controlplane.workerserving import HTTP_SOCKET_NAME
from llmgw.core.knowledge import KnowledgeSearch
from llmgw.core.relays import RelayPeer
from llmgw.core.settingtypes import VIP_SETTING
from llmgw.core.tenancy import Binding, Owner, OwnerKind, Place, user_place
from llmgw.errors import LlmgwError
from llmgw.gateway.app import Gateway
from llmgw.gateway.feeding import GatewayFeed
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.gateway.routing import Router
from llmgw.gateway.settings import GatewaySettings
from llmgw.knowledge.service import Knowledge, knowledge_for, own_url
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.builds import BuildIndex
from llmgw.observability.tracing import Tracing
from llmgw.portal.serving import Portal
from llmgw.protocol.channels import StateChannel
from llmgw.protocol.grpc_client import GrpcConnector, RelayClient
from llmgw.protocol.grpc_transport import AgentServer, TlsFiles
from llmgw.runtime.supervising import Policy, Supervisor
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.store.usage import UsageLog

log = logging.getLogger(__name__)


def replica_ready_to(feed: GatewayFeed) -> Callable[[ReplicaState, str], None]:
    """The fleet's ``on_ready``: a ready replica enters the gateway's table."""

    def ready(replica: ReplicaState, base_url: str) -> None:
        endpoint = ReplicaEndpoint(
            replica_id=replica.replica_id,
            model=replica.model,
            base_url=base_url,
            api_key=replica.api_key,
            capacity=replica.capacity,
            engine=replica.engine,
        )
        feed.replica_ready(endpoint, replica.adapter_paths)

    return ready


class KeyLoading:
    """Reads the active API keys, with their places, and the limits with their counts from the store
    into the gateway (at start, on leading, on a change), and the users' tokens and roles into the
    admin side's callers.

    A key of a user sits where the user does: the user's teams and organizations come from the
    user's role bindings, read in the same reload.
    """

    def __init__(self, store: Store, feed: GatewayFeed, callers: Callers, counts: LimitCounts) -> None:
        self._store = store
        self._feed = feed
        self._callers = callers
        self._counts = counts

    async def reload(self) -> None:
        keys = await self._store.keys.active()
        bindings = await self._store.users.bindings()
        limits = await self._store.limits.all()
        self._feed.keys_replaced(
            KeyEntry(
                key_id=k.id,
                name=k.name,
                secret_hash=k.secret_hash,
                owner=k.owner,
                place=key_place(k.place, bindings),
                collections=k.collections,
            )
            for k in keys
        )
        self._feed.limits_replaced(limits)
        await self._counts.load()
        await self._callers.load(self._store)


def key_place(at: Owner, bindings: Mapping[str, Sequence[Binding]]) -> Place:
    """Where a key at ``at`` sits: a project, or a user with the user's teams and organizations."""
    if at.kind is OwnerKind.USER:
        return user_place(at.path, bindings.get(at.path, ()))
    return Place(at)


@dataclass(frozen=True)
class ControlPlaneParts:
    """What the running control plane holds on to after the build."""

    store: Store
    gateway: Gateway
    reconciler: Reconciler
    leadership: Leadership
    sessions: NodeSessions
    admin: AdminApi
    agent_server: AgentServer
    http: HttpServer
    workers: WorkerSupervisor | None = None
    """The gateway workers serving /v1 on the HTTP port (``gateway.workers`` above 1), else None."""


async def record_vip(store: Store, name: str, vip: str) -> None:
    """Make this plane's floating address (``--vip``) known cluster-wide, so every plane's status shows it."""
    if vip and await store.settings.get(VIP_SETTING, "") != vip:
        await store.settings.set(VIP_SETTING, vip, name)


def knowledge_search(knowledge: Knowledge) -> KnowledgeSearch:
    """The cluster's search of its knowledge collections, for the gateway (docs/knowledge.md): the
    collections' index this control plane keeps (leader and standbys alike: it reads the store)."""
    return knowledge.index


def _log_unreachable(replica_id: str, reason: str) -> None:
    log.warning("replica %s unreachable: %s", replica_id, reason)


async def wire(
    config: ServerConfig,
    check_agent_settings: SettingsCheck,
    supervisor: Supervisor,
    closing: contextlib.AsyncExitStack,
    worker_log_args: Sequence[str] = (),
    knowledge: KnowledgeSearch | None = None,
) -> ControlPlaneParts:
    """Build every part in dependency order; ``closing`` closes them (in reverse) when the process ends.

    ``worker_log_args``: how gateway workers log (``--log-level``, ``--log-json``), if there are any.
    ``knowledge``: what the gateway searches knowledge collections with; None: the cluster's own
    search (:func:`knowledge_search`)."""
    config.data_path.mkdir(parents=True, exist_ok=True)
    fence = Fence(config.name)
    store = await Store.open(config.store_url, timeout_s=config.store.timeout_s)
    store.fence = fence  # the store's documented way in: every write then checks the lease
    closing.push_async_callback(store.close)
    watch_store(store.engine)
    blobs = BlobStore(config.data_path / "mirror")
    if removed := blobs.remove_leftovers():
        log.info("removed %d files that interrupted mirror imports left", removed)
    demand = ModelDemand()
    usage = UsageWriter(UsageLog(store), store.now, spill=UsageSpill(config.data_path))
    closing.callback(usage.close)
    tracing = Tracing.from_settings(config.tracing, f"llmgw-server {config.name}")
    closing.callback(tracing.shutdown)

    # embeds through this plane's own /v1 (docs/knowledge.md); ``http`` is bound below, before serving
    kb = knowledge_for(store, config.admin_token_sha256, lambda: own_url(config.http.host, http.port))
    closing.push_async_callback(kb.close)

    outbound = FollowerOutbound()  # bound to ``following`` once it is built
    gateway = Gateway(
        GatewaySettings(
            request_wait_s=config.gateway.request_wait_s,
            upstream_timeout_s=config.gateway.upstream_timeout_s,
            access_log=config.gateway.access_log,
            job_poll_s=config.gateway.job_poll_s,
            job_timeout_s=config.gateway.job_timeout_s,
            jobs_kept=config.gateway.jobs_kept,
            job_kept_s=config.gateway.job_kept_s,
            files_kept_s=config.gateway.files_kept_s,
            files_max_bytes=config.gateway.files_max_bytes,
        ),
        replicas=ReplicaTable(Router(config.routing)),
        # done here while leading; sent to the leader over the state stream otherwise
        outbound=outbound,
        tracing=tracing,
        knowledge=knowledge if knowledge is not None else knowledge_search(kb),
    )
    closing.push_async_callback(gateway.close)
    feed = gateway.feed
    state = GatewayState(feed)  # what the feed is told, streamed to the standbys while leading
    me = gateway.limiter.plane = config.name
    sharing = LimitSharing(config.name, feed, lambda: leadership.serving)

    def counted_by(tokens: dict[str, int], plane: str) -> None:
        counts.add(tokens)
        sharing.used(plane, tokens)

    on_request = request_dispatcher(
        usage.add, demand.want, demand.used, _log_unreachable, counted_by, on_usage_sums=usage.add_sums
    )
    workers = worker_count(config.gateway.workers)
    worker_loads = WorkerLoads()  # what the gateway workers have in flight, when there are any

    fleet = Fleet(
        on_ready=replica_ready_to(feed),
        on_gone=feed.replica_gone,
        node_grace_s=config.reconcile.node_grace_s,
    )
    reconciler = Reconciler(
        store,
        fleet,
        interval_s=config.reconcile.interval_s,
        backoff_s=config.reconcile.restart_backoff_s,
        backoff_max_s=config.reconcile.restart_backoff_max_s,
        on_catalog=feed.catalog_replaced,
        in_flight=lambda model: feed.in_flight(model) + worker_loads.in_flight(model),
        load=feed.model_load,
        drain=feed.replica_draining,
        replica_in_flight=lambda r: feed.replica_in_flight(r) + worker_loads.replica_in_flight(r),
        demand=demand,
        on_stopped=feed.set_stopped,
        on_pass=observe_pass,
        tracing=tracing,
    )
    callers = Callers(config.admin_token_sha256)
    # written while leading only (``leadership`` is built below, before anything runs)
    counts = LimitCounts(
        store,
        feed,
        gateway.limiter.clock,
        may_write=lambda: leadership.leading,
        hand_off=lambda tokens: following.request({"kind": "counted", "tokens": tokens, "plane": me}),
        observe=lambda tokens: sharing.used(config.name, tokens),
    )
    keys = KeyLoading(store, feed, callers, counts)
    try:
        await keys.reload()
    except LlmgwError as error:
        log.warning("could not load the API keys yet: %s", error)
    settings_push = SettingsPush(store, fleet)
    closing.push_async_callback(settings_push.close)

    async def before_leading() -> None:
        """Fill what the leader keeps in memory (keys, catalog, replicas placed) before it serves."""
        await keys.reload()
        await reconciler.load()
        await record_vip(store, config.name, config.leadership.vip)

    leadership = Leadership(
        Leases(store),
        fence,
        Identity(config.name, "", ""),
        lease_s=config.leadership.lease_s,
        before_leading=before_leading,
        store_timeout_s=config.store.timeout_s,
    )
    closing.push_async_callback(leadership.resign)
    closing.push_async_callback(counts.close)  # the last counts, written before resigning
    closing.callback(register_cluster(fleet, leadership))
    tls = TlsFiles(config.path(config.tls.ca), config.path(config.tls.cert), config.path(config.tls.key))

    def state_stream(address: str) -> Awaitable[StateChannel]:
        return GrpcConnector(address, tls).gateway_state(RELAY_CONNECT_S)

    following = StateFollowing(state, leadership, state_stream, on_request)
    outbound.bind(following)
    serving = StateServing(
        state,
        leadership,
        on_request,
        on_follower=lambda plane, joined: sharing.joined(plane) if joined else sharing.left(plane),
    )
    sessions = NodeSessions(
        store,
        fleet,
        reconciler,
        leadership,
        settings_push,
        on_kv_blocks=feed.kv_blocks,
        gpu_history=GpuHistory(),
    )
    closing.push_async_callback(sessions.records.close)

    def pull_from_peer(address: str, sha256: str, offset: int) -> AsyncIterator[bytes]:
        return GrpcConnector(address, tls).fetch(sha256, offset)

    replicator = MirrorReplicator(
        store,
        blobs,
        leadership,
        pull_from_peer,
        config.mirror,
        live_s=3 * config.leadership.lease_s,
    )
    training = TrainingScheduler(store, fleet, blobs, grace_s=config.training.node_grace_s)
    sessions.on_training = training.receive
    reconciler.training_holds = training.holds
    duties = LeaderDuties(leadership, supervisor, sessions, ["reconciler", "training"])
    admin = AdminApi(
        name=config.name,
        token_sha256=config.admin_token_sha256,
        store=store,
        fleet=fleet,
        reconciler=reconciler,
        blobs=blobs,
        on_keys_changed=keys.reload,
        leadership=leadership,
        settings_push=settings_push,
        check_agent_settings=check_agent_settings,
        components=supervisor.health,
        vip=config.leadership.vip,
        callers=callers,
        gpu_history=sessions.gpu_history,
        replicator=replicator,
    )

    upgrades = AgentUpgrades(fleet, blobs, config.path(config.release.trusted_pub))
    sessions.on_upgrade_result = upgrades.on_result
    admin.state.upgrades = upgrades
    admin.state.training = training
    admin.state.knowledge = kb
    admin.state.collection_pairs = kb.pairs  # `ctl train submit --pairs-from COLLECTION`
    access = BlobAccess(store, fleet, leading=lambda: leadership.serving)
    builds = BuildIndex(blobs.root)
    sessions.mirror_builds = builds.message

    async def blob_chunks(caller: RelayPeer, sha256: str, offset: int) -> AsyncIterator[bytes]:
        if sha256 not in builds.blobs():  # engine builds are for every node
            await access.check(caller, sha256)  # a peer pulls any blob; a node only its own replicas' files
        async for chunk in blobs.read_chunks(sha256, offset):
            yield chunk

    # the portal's files are served by every control plane, a standby too (docs/portal.md)
    local = route_by_prefix(gateway.asgi_app(), Portal(admin.app()))
    answering = RelayAnswering(local, leadership)
    relays = RelayClient(tls)
    closing.push_async_callback(relays.close)
    front = StandbyForwarding(
        local,
        leadership,
        relays.relay,
        config.gateway.request_wait_s,
        serves_v1=lambda: following.live,
        leader_decides=RuntimeAdapters(gateway.adapters, gateway.settings.max_body_bytes),
    )
    agent_server = AgentServer(
        sessions.serve,
        blob_chunks,
        tls,
        config.agent_server.host,
        config.agent_server.port,
        relay=answering.answer,
        state=serving.serve,
    )
    closing.push_async_callback(agent_server.stop)
    # the token and the body limit are checked before a standby's relaying reads a body
    edge = Admission(front, callers, config.http.api_body_max_bytes)
    pool: WorkerSupervisor | None = None
    if workers > 1:
        channel = WorkerChannelServer(
            state,
            gateway.limiter,
            following.request,
            serves=lambda: leadership.serving or following.live,
            loads=worker_loads,
        )
        summed = SummedRegistry(REGISTRY, lambda: list(channel.metrics.values()))
        inherited = inherited_workers()  # left serving by the previous start of this process
        http, pool = behind_workers(
            config,
            workers,
            serve_metrics(edge, summed, channel.fresh_metrics),
            closing,
            worker_log_args,
            port=inherited[0] if inherited is not None else 0,
        )
        supervisor.add("worker-channel", lambda: channel.run(config.data_path / SOCKET_NAME))
        supervisor.add("workers", pool.run)
        if inherited is not None:
            started = pool

            def own_serve() -> bool:
                mine = set(started.pids.values())
                serving = set(channel.pids.values())
                return len(mine) == workers and mine <= serving and (leadership.serving or following.live)

            supervisor.add("retire-workers", lambda: retire(inherited[1], own_serve))
    else:
        http = HttpServer(edge, config.http)
        handed_over = inherited_socket(config.http.host, config.http.port)
        if handed_over is not None:
            http.sockets = [handed_over]

    supervisor.add("http", http.serve_until_stopped, Policy.FATAL)
    supervisor.add("load-reader", gateway.loads.run)
    supervisor.add("usage-writer", usage.run)
    supervisor.add("limit-counts", counts.run)
    supervisor.add("limit-sharing", sharing.run)
    supervisor.add("callers", lambda: callers.keep_loaded(store))
    supervisor.add("reconciler", lambda: reconciler.run(may_act=lambda: leadership.leading), start=False)
    supervisor.add("training", training.run, start=False)
    supervisor.add("leader-duties", duties.follow)
    supervisor.add("mirror-replicator", replicator.run)
    supervisor.add("state-following", following.run)
    grace_s = config.reconcile.node_grace_s
    supervisor.add(
        "inherited-replicas", lambda: drop_inherited(state, leadership, lambda: set(fleet.replicas), grace_s)
    )
    return ControlPlaneParts(
        store, gateway, reconciler, leadership, sessions, admin, agent_server, http, pool
    )


def behind_workers(
    config: ServerConfig,
    workers: int,
    edge: ASGIApp,
    closing: contextlib.AsyncExitStack,
    log_args: Sequence[str] = (),
    port: int = 0,
) -> tuple[HttpServer, WorkerSupervisor]:
    """The HTTP port held (not listened on) for ``workers`` gateway workers, and this process's own
    HTTP server on its Unix socket, where the workers pass on all but ``/v1``. ``port``: the one the
    workers of a previous start of this process serve (else ``http.port``)."""
    held = reuse_port_socket(config.http.host, port or config.http.port, listen=False)
    closing.callback(held.close)
    port = int(held.getsockname()[1])
    listener = private_unix_socket(config.data_path / HTTP_SOCKET_NAME)
    closing.callback(lambda: (config.data_path / HTTP_SOCKET_NAME).unlink(missing_ok=True))
    copy = config.model_copy(update={"data_dir": str(config.data_path)})
    worker_config = config.data_path / "worker-server.yaml"
    save_server_config(copy, worker_config)
    log.info("%d gateway workers share HTTP port %d", workers, port)
    launch = subprocess_launcher(worker_config, port, log_args)
    return HttpServer(edge, config.http, listener, port), WorkerSupervisor(workers, launch)
