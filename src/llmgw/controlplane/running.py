"""Wiring of one control plane process: store, gateway, admin API, agent server, reconciler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import uvicorn

from llmgw.controlplane.admin import AdminApi
from llmgw.controlplane.agentsettings import SettingsCheck, SettingsPush, forbidden_only
from llmgw.controlplane.config import ServerConfig
from llmgw.controlplane.fleet import Fleet, ReplicaState
from llmgw.controlplane.reconciling import Reconciler
from llmgw.controlplane.sessions import NodeSessions
from llmgw.core.catalog import ModelDefinition
from llmgw.gateway.app import Gateway
from llmgw.gateway.catalog_view import ModelEntry
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.loads import LoadReader
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.usage import UsageRecord
from llmgw.mirror.blobs import BlobStore
from llmgw.protocol.grpc_transport import AgentServer, TlsFiles
from llmgw.store.database import Store

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
    """One control plane, leading (this foundation runs one per cluster)."""

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

    async def run(self, stop: asyncio.Event) -> None:
        config = self.config
        config.data_path.mkdir(parents=True, exist_ok=True)
        store = await Store.open(config.store_url, timeout_s=config.store.timeout_s)
        blobs = BlobStore(config.data_path / "mirror")
        reconciler_box: list[Reconciler] = []

        def on_usage(record: UsageRecord) -> None:
            reconciler_box[0].used(record.model)

        gateway = Gateway(
            GatewaySettings(
                request_wait_s=config.gateway.request_wait_s,
                upstream_timeout_s=config.gateway.upstream_timeout_s,
            ),
            on_demand=lambda model: reconciler_box[0].demand(model),
            on_usage=on_usage,
            on_replica_failed=lambda replica_id, reason: log.warning(
                "replica %s unreachable: %s", replica_id, reason
            ),
        )

        def on_ready(replica: ReplicaState, base_url: str) -> None:
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
            gateway.catalog.replace(
                ModelEntry(
                    name=m.name,
                    on_demand=m.on_demand or m.replicas.min == 0,
                    created=0,
                    owner=m.owner or "llmgw",
                )
                for m in models
            )

        def on_gone(replica_id: str) -> None:
            gateway.replicas.remove(replica_id)

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
        )
        reconciler_box.append(reconciler)
        await self._reload_keys(store, gateway)
        settings_push = SettingsPush(store, fleet)

        async def keys_changed() -> None:
            await self._reload_keys(store, gateway)

        admin = AdminApi(
            name=config.name,
            token_sha256=config.admin_token_sha256,
            store=store,
            fleet=fleet,
            reconciler=reconciler,
            blobs=blobs,
            on_keys_changed=keys_changed,
            settings_push=settings_push,
            check_agent_settings=self._check_agent_settings,
        )
        address = f"{config.agent_server.host}:{config.agent_server.port}"
        sessions = NodeSessions(store, fleet, reconciler, config.name, address, settings_push)

        async def blob_chunks(sha256: str, offset: int) -> AsyncIterator[bytes]:
            async for chunk in blobs.read_chunks(sha256, offset):
                yield chunk

        tls = TlsFiles(config.path(config.tls.ca), config.path(config.tls.cert), config.path(config.tls.key))
        agent_server = AgentServer(
            sessions.serve, blob_chunks, tls, config.agent_server.host, config.agent_server.port
        )
        server = _Server(
            uvicorn.Config(
                route_by_prefix(gateway.asgi_app(), admin.app()),
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
                reconciling = tasks.create_task(reconciler.run())
                reading_loads = tasks.create_task(LoadReader(gateway.replicas).run())
                while not server.started:
                    if serving.done():
                        break
                    await asyncio.sleep(0.02)
                if server.started:
                    self.http_port = server.servers[0].sockets[0].getsockname()[1]
                    log.info(
                        "control plane %s serving on http://%s:%d, agents on %s",
                        config.name,
                        config.http.host,
                        self.http_port,
                        address,
                    )
                    self.ready.set()
                await stop.wait()
                server.should_exit = True
                reconciling.cancel()
                reading_loads.cancel()
        finally:
            await settings_push.close()
            await agent_server.stop()
            await gateway.close()
            await store.close()


async def run_until_signalled(
    config: ServerConfig, check_agent_settings: SettingsCheck = forbidden_only
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await ControlPlane(config, check_agent_settings).run(stop)
