"""Wiring of one control plane process: store, gateway, admin API, agent server, reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import uvicorn

from llmgw.controlplane.admin import AdminApi
from llmgw.controlplane.agentsettings import SettingsCheck, SettingsPush, forbidden_only
from llmgw.controlplane.config import ServerConfig
from llmgw.controlplane.fleet import Fleet, ReplicaState
from llmgw.controlplane.leadership import LEADING, STANDBY, Identity, Leadership
from llmgw.controlplane.reconciling import Reconciler
from llmgw.controlplane.relaying import RelayAnswering, StandbyForwarding
from llmgw.controlplane.sessions import NodeSessions
from llmgw.controlplane.usage_writing import UsageWriter
from llmgw.core.catalog import ModelDefinition
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.errors import LlmgwError
from llmgw.gateway.adapters import adapter_entries
from llmgw.gateway.app import Gateway
from llmgw.gateway.catalog_view import catalog_entries
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.loads import LoadReader
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.gateway.routing import Router
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.usage import UsageRecord
from llmgw.mirror.blobs import BlobStore
from llmgw.protocol.grpc_transport import AgentServer, RelayClient, TlsFiles
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.store.usage import UsageLog

log = logging.getLogger(__name__)

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]


def route_by_prefix(gateway: ASGIApp, other: ASGIApp) -> ASGIApp:
    """``/v1`` to the gateway without any framework in between; everything else to the admin app."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            await gateway(scope, receive, send)
        else:
            await other(scope, receive, send)

    return app


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the process wiring owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ControlPlane:
    """One control plane: leads while it holds the lease, stands by (relaying to the leader) otherwise."""

    def __init__(self, config: ServerConfig, check_agent_settings: SettingsCheck = forbidden_only) -> None:
        self.config = config
        self._check_agent_settings = check_agent_settings
        """How agents' settings are checked before they are kept: agent.yaml's schema, from the wiring."""
        self.ready = asyncio.Event()
        self.http_port = 0
        self.agent_port = 0

    async def _reload_keys(self, store: Store, gateway: Gateway) -> None:
        gateway.keys.replace(
            KeyEntry(key_id=k.id, name=k.name, secret_hash=k.secret_hash, owner=k.owner)
            for k in await store.keys.active()
        )

    async def _before_leading(self, store: Store, gateway: Gateway, reconciler: Reconciler) -> None:
        """Fill what the leader keeps in memory (keys, catalog, replicas placed) before it serves anything."""
        await self._reload_keys(store, gateway)
        await reconciler.load()

    async def run(self, stop: asyncio.Event) -> None:
        config = self.config
        config.data_path.mkdir(parents=True, exist_ok=True)
        store = await Store.open(config.store_url, timeout_s=config.store.timeout_s)
        fence = Fence(config.name)
        store.fence = fence
        blobs = BlobStore(config.data_path / "mirror")
        reconciler_box: list[Reconciler] = []
        usage = UsageWriter(UsageLog(store), store.now)

        def on_usage(record: UsageRecord) -> None:
            adapter = gateway.adapters.get(record.model)  # an adapter's requests keep its model in use
            reconciler_box[0].used(adapter.model if adapter is not None else record.model)
            usage.add(record)

        gateway = Gateway(
            GatewaySettings(
                request_wait_s=config.gateway.request_wait_s,
                upstream_timeout_s=config.gateway.upstream_timeout_s,
            ),
            replicas=ReplicaTable(Router(config.routing)),
            on_demand=lambda model: reconciler_box[0].demand(model),
            on_usage=on_usage,
            on_replica_failed=lambda replica_id, reason: log.warning(
                "replica %s unreachable: %s", replica_id, reason
            ),
        )

        def on_ready(replica: ReplicaState, base_url: str) -> None:
            gateway.adapters.set_paths(replica.replica_id, replica.adapter_paths)
            gateway.replicas.set_ready(
                ReplicaEndpoint(
                    replica_id=replica.replica_id,
                    model=replica.model,
                    base_url=base_url,
                    api_key=replica.api_key,
                    capacity=replica.capacity,
                    engine=replica.engine,
                )
            )

        def on_catalog(models: list[ModelDefinition]) -> None:
            gateway.catalog.replace(catalog_entries(models))
            gateway.adapters.replace(adapter_entries(models))

        def on_gone(replica_id: str) -> None:
            gateway.replicas.remove(replica_id)
            gateway.adapters.forget(replica_id)

        fleet = Fleet(on_ready=on_ready, on_gone=on_gone)
        reconciler = Reconciler(
            store,
            fleet,
            interval_s=config.reconcile.interval_s,
            backoff_s=config.reconcile.restart_backoff_s,
            backoff_max_s=config.reconcile.restart_backoff_max_s,
            on_catalog=on_catalog,
            in_flight=lambda model: sum(
                gateway.replicas.in_flight(e.replica_id) for e in gateway.replicas.ready(model)
            ),
            may_act=lambda: leadership.leading,
        )
        reconciler_box.append(reconciler)
        try:
            await self._reload_keys(store, gateway)
        except LlmgwError as error:
            log.warning("could not load the API keys yet: %s", error)
        settings_push = SettingsPush(store, fleet)

        async def keys_changed() -> None:
            await self._reload_keys(store, gateway)

        leader_work = LeaderWork(reconciler)
        leadership = Leadership(
            Leases(store),
            fence,
            Identity(config.name, "", ""),
            lease_s=config.leadership.lease_s,
            on_change=leader_work.on_change,
            before_leading=lambda: self._before_leading(store, gateway, reconciler),
            on_planes=lambda: leader_work.sessions.tell_planes() if leader_work.sessions else None,
        )
        admin = AdminApi(
            name=config.name,
            token_sha256=config.admin_token_sha256,
            store=store,
            fleet=fleet,
            reconciler=reconciler,
            blobs=blobs,
            on_keys_changed=keys_changed,
            leadership=leadership,
            settings_push=settings_push,
            check_agent_settings=self._check_agent_settings,
        )
        admin.vip = config.leadership.vip
        sessions = NodeSessions(store, fleet, reconciler, leadership, settings_push)
        leader_work.sessions = sessions

        def on_kv_blocks(blocks: KvBlocksUpdate) -> None:
            router = gateway.replicas.router
            router.set_block_hashing(blocks.model, blocks.hash_seed, blocks.block_size)
            if blocks.reset:
                router.kv.clear(blocks.replica_id)
            router.kv.stored(blocks.replica_id, blocks.stored)
            router.kv.removed(blocks.replica_id, blocks.removed)

        sessions.on_kv_blocks = on_kv_blocks

        async def blob_chunks(sha256: str, offset: int) -> AsyncIterator[bytes]:
            async for chunk in blobs.read_chunks(sha256, offset):
                yield chunk

        tls = TlsFiles(config.path(config.tls.ca), config.path(config.tls.cert), config.path(config.tls.key))
        local = route_by_prefix(
            refuse_when_stopped(gateway.asgi_app(), lambda: reconciler.stopped), admin.app()
        )
        answering = RelayAnswering(local, leadership)

        relays = RelayClient(tls)
        front = StandbyForwarding(local, leadership, relays.relay, config.gateway.request_wait_s)
        agent_server = AgentServer(
            sessions.serve,
            blob_chunks,
            tls,
            config.agent_server.host,
            config.agent_server.port,
            relay=answering.answer,
        )
        server = _Server(
            uvicorn.Config(
                front,
                host=config.http.host,
                port=config.http.port,
                loop="none",
                http="httptools",
                lifespan="off",
                log_level="warning",
                access_log=False,
                timeout_keep_alive=75,
            )
        )
        try:
            self.agent_port = await agent_server.start()
            async with asyncio.TaskGroup() as tasks:
                serving = tasks.create_task(server.serve())
                reading_loads = tasks.create_task(LoadReader(gateway.replicas).run())
                writing = tasks.create_task(usage.run())
                while not server.started:
                    if serving.done():
                        break
                    await asyncio.sleep(0.02)
                if server.started:
                    self.http_port = server.servers[0].sockets[0].getsockname()[1]
                    leadership.me = Identity(
                        config.name,
                        f"{config.agent_server.host}:{self.agent_port}",
                        f"http://{config.http.host}:{self.http_port}",
                    )
                    leading = tasks.create_task(leadership.run())
                    log.info(
                        "control plane %s serving on %s, agents on %s",
                        config.name,
                        leadership.me.http_address,
                        leadership.me.agent_address,
                    )
                    self.ready.set()
                    await stop.wait()
                    # Agents' streams end at once, so they move to another control plane now.
                    await agent_server.stop()
                    leading.cancel()
                    leader_work.stop()
                    await leadership.resign()
                server.should_exit = True
                reading_loads.cancel()
                writing.cancel()  # it writes what waits before it ends
        finally:
            leader_work.stop()
            await settings_push.close()
            await agent_server.stop()
            await relays.close()
            await gateway.close()
            await store.close()


class LeaderWork:
    """Starts and stops what only the leader does as leadership comes and goes."""

    def __init__(self, reconciler: Reconciler) -> None:
        self._reconciler = reconciler
        self.sessions: NodeSessions | None = None
        self._task: asyncio.Task[None] | None = None

    async def _lead(self) -> None:
        await self._reconciler.run()

    def on_change(self, state: str) -> None:
        if state == LEADING:
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._lead(), name="reconciler")
            return
        self.stop()
        if state == STANDBY and self.sessions is not None:
            released = self.sessions.let_go()
            if released:
                log.info("let %d agents go to the new leader", released)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


def refuse_when_stopped(gateway: ASGIApp, stopped: Callable[[], bool]) -> ASGIApp:
    """While ``llmgw stop`` holds, every POST under ``/v1/`` gets 503 ``system_stopped``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and stopped():
            body = json.dumps(
                {
                    "error": {
                        "message": "the system is stopped: no model is served",
                        "type": "service_unavailable",
                        "code": "system_stopped",
                        "hint": "an administrator starts it again with 'llmgw start'",
                    }
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", b"%d" % len(body)),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await gateway(scope, receive, send)

    return app


async def run_until_signalled(
    config: ServerConfig, check_agent_settings: SettingsCheck = forbidden_only
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await ControlPlane(config, check_agent_settings).run(stop)
