"""The control plane's parts, group by group: each group's frozen dataclass and the function
that builds it, with the pieces they share (the gateway's feed told of ready replicas, keys
loaded from the store, the HTTP port bound). :mod:`llmgw.controlplane.wiring` builds the
groups in order into :class:`~llmgw.controlplane.wiring.ControlPlaneParts` and runs them."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import REGISTRY

from llmgw.controlplane.accounting.limit_counting import LimitCounts
from llmgw.controlplane.accounting.limit_sharing import LimitSharing
from llmgw.controlplane.accounting.usage_spilling import UsageSpill
from llmgw.controlplane.accounting.usage_writing import UsageWriter
from llmgw.controlplane.admin.admission import Admission
from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.admin.callers import Callers
from llmgw.controlplane.admin.metricsaccess import metrics_refusal
from llmgw.controlplane.admin.signin import SessionCookies
from llmgw.controlplane.config import ServerConfig, save_server_config
from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.lifecycle.selfrestart import inherited_socket, inherited_workers
from llmgw.controlplane.lifecycle.upgrading import AgentUpgrades
from llmgw.controlplane.metrics.clustermetrics import observe_pass, register_cluster, watch_store
from llmgw.controlplane.metrics.workermetrics import SummedRegistry, metrics_only, serve_metrics
from llmgw.controlplane.mirror.blobaccess import BlobAccess
from llmgw.controlplane.mirror.replicating import MirrorReplicator
from llmgw.controlplane.nodes.agentsettings import SettingsCheck, SettingsPush
from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.controlplane.nodes.gpu_history import GpuHistory
from llmgw.controlplane.nodes.sessions import NodeSessions
from llmgw.controlplane.replicas.demand import ModelDemand
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.controlplane.serving.batchbook import StoreBatchBook
from llmgw.controlplane.serving.clientstore import open_client_store
from llmgw.controlplane.serving.filebook import FileExpiry, FileSettings, MirrorFileBook
from llmgw.controlplane.serving.front import gateway_first
from llmgw.controlplane.serving.gatewaybuilding import Outbox
from llmgw.controlplane.serving.httpserving import ASGIApp, HttpServer, reuse_port_socket, route_by_prefix
from llmgw.controlplane.serving.jobrecords import FileBookJobFiles, StoreJobRecords, runner_name
from llmgw.controlplane.serving.relaying import RELAY_CONNECT_S, RelayAnswering, StandbyForwarding
from llmgw.controlplane.serving.workers import WorkerSupervisor, subprocess_launcher
from llmgw.controlplane.serving.workerserving import HTTP_SOCKET_NAME
from llmgw.controlplane.statesharing.gatewaystate import GatewayState
from llmgw.controlplane.statesharing.localchannel import (
    WorkerChannelServer,
    WorkerLoads,
    private_unix_socket,
)
from llmgw.controlplane.statesharing.stateevents import Counted
from llmgw.controlplane.statesharing.statestream import (
    RuntimeAdapters,
    StateFollowing,
    StateServing,
    request_dispatcher,
)
from llmgw.controlplane.training.scheduling import TrainingScheduler
from llmgw.core.knowledge import KnowledgeSearch
from llmgw.core.pricing import Prices
from llmgw.core.relays import RelayPeer
from llmgw.core.scaling import ModelLoad
from llmgw.core.settingtypes import VIP_SETTING
from llmgw.core.tenancy import Binding, Owner, OwnerKind, Place, user_place
from llmgw.errors import ConfigError, LlmgwError
from llmgw.gateway.app import Gateway
from llmgw.gateway.feeding import GatewayFeed
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.knowledge.service import Knowledge
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.builds import BuildIndex
from llmgw.observability.tracing import Tracing
from llmgw.portal.serving import Portal
from llmgw.protocol.channels import StateChannel
from llmgw.protocol.grpc_client import GrpcConnector, RelayClient
from llmgw.protocol.grpc_transport import AgentServer, TlsFiles
from llmgw.runtime.supervising import Supervisor
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.store.secretbox import load_or_create
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
    """Reads the active API keys, with their places, the models' prices, and the limits with their
    counts from the store into the gateway (at start, on leading, on a change), and the users' tokens
    and roles into the admin side's callers.

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
        self._feed.prices_replaced(Prices.from_settings(await self._store.settings.all()))
        self._feed.limits_replaced(limits)
        await self._counts.load()
        await self._callers.load(self._store)


def key_place(at: Owner, bindings: Mapping[str, Sequence[Binding]]) -> Place:
    """Where a key at ``at`` sits: a project, or a user with the user's teams and organizations."""
    if at.kind is OwnerKind.USER:
        return user_place(at.path, bindings.get(at.path, ()))
    return Place(at)


async def record_vip(store: Store, name: str, vip: str) -> None:
    """Make this plane's floating address (``--vip``) known cluster-wide, so every plane's status shows it."""
    if vip and await store.settings.get(VIP_SETTING, "") != vip:
        await store.settings.set(VIP_SETTING, vip, name)


def knowledge_search(knowledge: Knowledge) -> KnowledgeSearch:
    """The cluster's search of its knowledge collections, for the gateway (docs/knowledge.md): the
    collections' index this control plane keeps (leader and standbys alike: it reads the store)."""
    return knowledge.index


def log_unreachable(replica_id: str, reason: str) -> None:
    log.warning("replica %s unreachable: %s", replica_id, reason)


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: any free port), not yet listening: the HTTP server
    listens on it once it serves. Bound first, so that every part naming the port is built knowing it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ConfigError(
            f"cannot serve HTTP on {host}:{port}: {error.strerror}",
            hint="free that port or set http.port in server.yaml to one that is free",
        ) from error
    return sock


LEADER_ONLY = ("reconciler", "training", "batches", "file-expiry", "job-pickup", "response-sweeper")
"""The components that run while this plane leads (started and stopped by ``leader-duties``)."""


@dataclass(frozen=True)
class Foundation:
    """What every other part stands on: the store (its writes fenced by the lease), the store as
    what clients make is kept (unfenced), the mirror's blobs, the models' demand, the usage writer,
    tracing and the TLS files."""

    store: Store
    fence: Fence
    clients: Store
    """The same database for what clients make (conversations, jobs, files, batches): its writes
    are not fenced, since a standby and a gateway worker answer clients too and keep what they
    made (:func:`open_client_store`)."""
    blobs: BlobStore
    demand: ModelDemand
    usage: UsageWriter
    tracing: Tracing
    tls: TlsFiles


async def build_foundation(config: ServerConfig, closing: contextlib.AsyncExitStack) -> Foundation:
    config.data_path.mkdir(parents=True, exist_ok=True)
    fence = Fence(config.name)
    secrets = load_or_create(config.path(config.store.secrets_key))
    store = await Store.open(config.store_url, timeout_s=config.store.timeout_s, secrets=secrets)
    store.fence = fence  # the store's documented way in: every write then checks the lease
    closing.push_async_callback(store.close)
    watch_store(store.engine)
    clients = await open_client_store(config, closing)
    blobs = BlobStore(config.data_path / "mirror")
    if removed := blobs.remove_leftovers():
        log.info("removed %d files that interrupted mirror imports left", removed)
    usage = UsageWriter(UsageLog(store), store.now, spill=UsageSpill(config.data_path))
    closing.callback(usage.close)
    tracing = Tracing.from_settings(config.tracing, f"llmgw-server {config.name}")
    closing.callback(tracing.shutdown)
    tls = TlsFiles(config.path(config.tls.ca), config.path(config.tls.cert), config.path(config.tls.key))
    return Foundation(store, fence, clients, blobs, ModelDemand(), usage, tracing, tls)


@dataclass(frozen=True)
class Listening:
    """The HTTP port, bound before any part that names it is built."""

    port: int
    """The port clients reach this plane on."""
    listener: socket.socket
    """What this process's HTTP server serves on: the port itself, or behind gateway workers its Unix
    socket (``http.sock``), where the workers pass on all but ``/v1``."""
    workers: int
    """The gateway worker processes serving the port (1: none, this process serves it)."""
    inherited: tuple[int, list[int]] | None = None
    """The port and pids of the workers a previous start of this process left serving."""


def listen(config: ServerConfig, workers: int, closing: contextlib.AsyncExitStack) -> Listening:
    host = config.http.host
    if workers <= 1:
        sock = inherited_socket(host, config.http.port) or bound_socket(host, config.http.port)
        closing.callback(sock.close)
        return Listening(int(sock.getsockname()[1]), sock, 1)
    inherited = inherited_workers()  # left serving by the previous start of this process
    # the port held (not listened on): the workers, and those restarted later, bind it too
    held = reuse_port_socket(host, inherited[0] if inherited else config.http.port, listen=False)
    closing.callback(held.close)
    port = int(held.getsockname()[1])
    path = config.data_path / HTTP_SOCKET_NAME
    listener = private_unix_socket(path)
    closing.callback(lambda: path.unlink(missing_ok=True))
    log.info("%d gateway workers share HTTP port %d", workers, port)
    return Listening(port, listener, workers, inherited)


@dataclass(frozen=True)
class Leading:
    """Who leads, and the gateway's state and requests between this plane and the others."""

    state: GatewayState
    """What the gateway's feed is told, streamed to the standbys (and workers) while leading."""
    leadership: Leadership
    sharing: LimitSharing
    counts: LimitCounts
    following: StateFollowing
    serving: StateServing


def build_lease(config: ServerConfig, base: Foundation, closing: contextlib.AsyncExitStack) -> Leadership:
    """The leader lease as this plane takes and follows it (it resigns when the plane closes)."""
    leadership = Leadership(
        Leases(base.store),
        base.fence,
        Identity(config.name, "", ""),  # where it is reached is known once it serves: handed to ``run``
        lease_s=config.leadership.lease_s,
        store_timeout_s=config.store.timeout_s,
    )
    closing.push_async_callback(leadership.resign)
    return leadership


@dataclass(frozen=True)
class ClientData:
    """What clients make, kept so that any plane or worker answers for it: files (bytes in the
    mirror, which the replicator copies between planes) and batches."""

    replicator: MirrorReplicator
    files: MirrorFileBook
    batches: StoreBatchBook
    file_expiry: FileExpiry
    """A leader duty: deletes the files past their expiry."""
    job_records: StoreJobRecords
    """ComfyUI jobs this plane's gateway follows, written for any process to answer for."""
    job_files: FileBookJobFiles


def build_client_data(config: ServerConfig, base: Foundation, leadership: Leadership) -> ClientData:
    tls = base.tls

    def pull_from_peer(address: str, sha256: str, offset: int) -> AsyncIterator[bytes]:
        return GrpcConnector(address, tls).fetch(sha256, offset)

    live_s = 3 * config.leadership.lease_s
    replicator = MirrorReplicator(
        base.store, base.blobs, leadership, pull_from_peer, config.mirror, live_s=live_s
    )
    settings = FileSettings.of(config.files)
    files = MirrorFileBook(base.clients, base.blobs, replicator, settings)
    batches = StoreBatchBook(base.clients.batches, files)
    records = StoreJobRecords(base.clients, runner_name(config.name))
    job_files = FileBookJobFiles(files, config.gateway.files_kept_s)
    return ClientData(replicator, files, batches, FileExpiry(base.clients, settings), records, job_files)


def build_leading(
    config: ServerConfig,
    base: Foundation,
    leadership: Leadership,
    gateway: Gateway,
    outbox: Outbox,
    closing: contextlib.AsyncExitStack,
) -> Leading:
    feed, me = gateway.feed, config.name
    state = GatewayState(feed)
    sharing = LimitSharing(me, feed, lambda: leadership.serving)
    counts = LimitCounts(  # written while leading only
        base.store,
        feed,
        gateway.limiter.clock,
        may_write=lambda: leadership.leading,
        hand_off=lambda tokens: outbox.request(Counted(tokens, me)),
        observe=lambda tokens: sharing.used(me, tokens),
    )
    closing.push_async_callback(counts.close)  # the last counts, written before resigning

    def counted_by(tokens: dict[str, int], plane: str) -> None:
        counts.add(tokens)
        sharing.used(plane, tokens)

    usage, demand = base.usage, base.demand
    on_request = request_dispatcher(
        usage.add, demand.want, demand.used, log_unreachable, counted_by, on_usage_sums=usage.add_sums
    )
    tls = base.tls

    def state_stream(address: str) -> Awaitable[StateChannel]:
        return GrpcConnector(address, tls).gateway_state(RELAY_CONNECT_S)

    following = StateFollowing(state, leadership, state_stream, on_request)
    serving = StateServing(
        state,
        leadership,
        on_request,
        on_follower=lambda plane, joined: sharing.joined(plane) if joined else sharing.left(plane),
    )
    return Leading(state, leadership, sharing, counts, following, serving)


@dataclass(frozen=True)
class Replicas:
    """The replicas this plane knows of (the fleet), and the leader's loop that places them."""

    fleet: Fleet
    worker_loads: WorkerLoads
    """What the gateway workers have in flight, when there are any."""
    training: TrainingScheduler
    reconciler: Reconciler


def with_waiting(load: ModelLoad, elsewhere: int) -> ModelLoad:
    """``load`` with the requests waiting in the workers' flow queues added: autoscaling reads them
    as it reads this process's own."""
    return dataclasses.replace(load, waiting=load.waiting + elsewhere) if elsewhere else load


def build_replicas(config: ServerConfig, base: Foundation, gateway: Gateway) -> Replicas:
    feed, reconcile = gateway.feed, config.reconcile
    loads = WorkerLoads()
    fleet = Fleet(
        on_ready=replica_ready_to(feed), on_gone=feed.replica_gone, node_grace_s=reconcile.node_grace_s
    )
    training = TrainingScheduler(base.store, fleet, base.blobs, grace_s=config.training.node_grace_s)
    reconciler = Reconciler(
        base.store,
        fleet,
        interval_s=reconcile.interval_s,
        backoff_s=reconcile.restart_backoff_s,
        backoff_max_s=reconcile.restart_backoff_max_s,
        on_catalog=feed.catalog_replaced,
        in_flight=lambda model: feed.in_flight(model) + loads.in_flight(model),
        load=lambda model: with_waiting(feed.model_load(model), loads.waiting(model)),
        drain=feed.replica_draining,
        replica_in_flight=lambda r: feed.replica_in_flight(r) + loads.replica_in_flight(r),
        demand=base.demand,
        on_stopped=feed.set_stopped,
        on_pass=observe_pass,
        tracing=base.tracing,
        training_holds=training.holds,
    )
    return Replicas(fleet, loads, training, reconciler)


@dataclass(frozen=True)
class Nodes:
    """Who may call, the keys loaded, and the agents' side: their sessions, settings, upgrades and
    the mirror they fetch from."""

    callers: Callers
    keys: KeyLoading
    settings_push: SettingsPush
    upgrades: AgentUpgrades
    builds: BuildIndex
    sessions: NodeSessions


async def build_nodes(
    config: ServerConfig,
    base: Foundation,
    gateway: Gateway,
    leading: Leading,
    replicas: Replicas,
    closing: contextlib.AsyncExitStack,
) -> Nodes:
    store, fleet, blobs, leadership = base.store, replicas.fleet, base.blobs, leading.leadership
    callers = Callers(config.admin_token_sha256)
    keys = KeyLoading(store, gateway.feed, callers, leading.counts)
    try:
        await keys.reload()
    except LlmgwError as error:
        log.warning("could not load the API keys yet: %s", error)
    settings_push = SettingsPush(store, fleet)
    closing.push_async_callback(settings_push.close)
    closing.callback(register_cluster(fleet, leadership))
    upgrades = AgentUpgrades(fleet, blobs, config.path(config.release.trusted_pub), store)
    builds = BuildIndex(blobs.root)
    sessions = NodeSessions(
        store,
        fleet,
        replicas.reconciler,
        leadership,
        settings_push,
        on_kv_blocks=gateway.feed.kv_blocks,
        gpu_history=GpuHistory(),
        on_upgrade_result=upgrades.on_result,
        on_training=replicas.training.receive,
        mirror_builds=builds.message,
    )
    closing.push_async_callback(sessions.records.close)
    return Nodes(callers, keys, settings_push, upgrades, builds, sessions)


def build_admin(
    config: ServerConfig,
    parts: tuple[Foundation, ClientData, Leading, Replicas, Nodes],
    kb: Knowledge,
    check_agent_settings: SettingsCheck,
    supervisor: Supervisor,
) -> AdminApi:
    base, data, leading, replicas, nodes = parts
    return AdminApi(
        name=config.name,
        token_sha256=config.admin_token_sha256,
        store=base.store,
        fleet=replicas.fleet,
        reconciler=replicas.reconciler,
        blobs=base.blobs,
        on_keys_changed=nodes.keys.reload,
        leadership=leading.leadership,
        settings_push=nodes.settings_push,
        check_agent_settings=check_agent_settings,
        components=supervisor.health,
        vip=config.leadership.vip,
        callers=nodes.callers,
        gpu_history=nodes.sessions.gpu_history,
        replicator=data.replicator,
        upgrades=nodes.upgrades,
        training=replicas.training,
        knowledge=kb,
        collection_pairs=kb.pairs,  # `ctl train submit --pairs-from COLLECTION`
        mirror=config.mirror,
    )


def blob_chunks(
    access: BlobAccess, builds: BuildIndex, blobs: BlobStore
) -> Callable[[RelayPeer, str, int], AsyncIterator[bytes]]:
    async def blob_chunks(caller: RelayPeer, sha256: str, offset: int) -> AsyncIterator[bytes]:
        if sha256 not in builds.blobs():  # engine builds are for every node
            await access.check(caller, sha256)  # a peer pulls any blob; a node only its own replicas' files
        async for chunk in blobs.read_chunks(sha256, offset):
            yield chunk

    return blob_chunks


def build_edges(
    config: ServerConfig,
    parts: tuple[Foundation, Gateway, Leading, Replicas, Nodes],
    admin: AdminApi,
    closing: contextlib.AsyncExitStack,
) -> tuple[AgentServer, ASGIApp]:
    """The agents' server, and what the HTTP port serves: the token and the body limit checked before
    a standby's relaying reads a body."""
    base, gateway, leading, replicas, nodes = parts
    leadership, following = leading.leadership, leading.following
    access = BlobAccess(base.store, replicas.fleet, leading=lambda: leadership.serving)
    # the portal's files are served by every control plane, a standby too (docs/portal.md)
    served = gateway.asgi_app()
    local = route_by_prefix(served, Portal(admin.app()))
    relays = RelayClient(base.tls)
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
        nodes.sessions.serve,
        blob_chunks(access, nodes.builds, base.blobs),
        base.tls,
        config.agent_server.host,
        config.agent_server.port,
        relay=RelayAnswering(local, leadership).answer,
        state=leading.serving.serve,
    )
    closing.push_async_callback(agent_server.stop)
    edge = SessionCookies(
        Admission(front, nodes.callers, config.http.api_body_max_bytes, config.http.metrics_address)
    )
    return agent_server, gateway_first(served, edge, lambda: leadership.serving)


def build_http(
    config: ServerConfig,
    listening: Listening,
    edge: ASGIApp,
    channel: WorkerChannelServer | None,
    worker_log_args: Sequence[str],
    callers: Callers,
) -> tuple[HttpServer, WorkerSupervisor | None]:
    """This process's HTTP server and, behind the port, the gateway workers (``gateway.workers``
    above 1), launched on a copy of this plane's config that names its data dir."""
    if channel is None:
        return HttpServer(edge, config.http, listening.listener), None
    summed = SummedRegistry(REGISTRY, lambda: list(channel.metrics.values()))
    worker_config = config.data_path / "worker-server.yaml"
    save_server_config(config.model_copy(update={"data_dir": str(config.data_path)}), worker_config)
    launch = subprocess_launcher(worker_config, listening.port, worker_log_args)
    address = config.http.metrics_address
    edge = serve_metrics(
        edge, summed, channel.fresh_metrics, lambda auth: metrics_refusal(callers, auth, address)
    )
    return HttpServer(edge, config.http, listening.listener, listening.port), WorkerSupervisor(
        listening.workers, launch
    )


def build_metrics_http(config: ServerConfig, channel: WorkerChannelServer | None) -> HttpServer | None:
    """``/metrics`` without a token on ``http.metrics_address`` (None when unset): this process's
    metrics, with its workers' gateway samples added as on the HTTP port."""
    if not config.http.metrics_address:
        return None
    host, port = config.http.metrics_host_port()
    settings = config.http.model_copy(update={"host": host, "port": port, "max_connections": 64})
    if channel is None:
        return HttpServer(metrics_only(), settings)
    summed = SummedRegistry(REGISTRY, lambda: list(channel.metrics.values()))
    return HttpServer(metrics_only(summed, channel.fresh_metrics), settings)


def build_worker_channel(
    listening: Listening, gateway: Gateway, leading: Leading, replicas: Replicas
) -> WorkerChannelServer | None:
    """The gateway's state to the workers and their usage back, when there are workers."""
    if listening.workers <= 1:
        return None
    leadership, following = leading.leadership, leading.following
    return WorkerChannelServer(
        leading.state,
        gateway.limiter,
        following.request,
        serves=lambda: leadership.serving or following.live,
        loads=replicas.worker_loads,
    )
