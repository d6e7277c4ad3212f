"""A real admin API on a loopback port (uvicorn in a thread) for the commands to talk to."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from llmgw.controlplane.fleet import Fleet, ReplicaState
from llmgw.core.health import ComponentHealth, ComponentState
from llmgw.store.database import Store
from llmgw.testing.admin import admin_api

TOKEN = "llmgw-admin-cli-test"
FAILED_AT = 1_700_000_000.0


@dataclass
class AdminServer:
    url: str
    token: str
    fleet: Fleet

    def options(self) -> list[str]:
        return ["--url", self.url, "--token", self.token]


COMPONENTS = [
    ComponentHealth("reconciler", ComponentState.RUNNING),
    ComponentHealth("load-reader", ComponentState.RESTARTING, 2, "OSError: connection refused", FAILED_AT),
    ComponentHealth("usage-writer", ComponentState.FAILED, 5, "StoreUnavailable: gone", FAILED_AT + 60),
]


@pytest.fixture
def admin_server(tmp_path: Path) -> Iterator[AdminServer]:
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen()  # connections wait in the backlog until uvicorn accepts them
    port = listening.getsockname()[1]
    ready = threading.Event()
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    fleet.replicas["r-1"] = ReplicaState("r-1", "m1", "node1", "k", state="ready", port=9001, compute="cpu")
    holder: dict[str, uvicorn.Server] = {}

    async def serve() -> None:
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")

        admin = admin_api(store, tmp_path, token=TOKEN, fleet=fleet, components=lambda: COMPONENTS)
        server = uvicorn.Server(uvicorn.Config(admin.app(), log_level="warning", lifespan="off"))
        holder["server"] = server
        ready.set()
        try:
            await server.serve(sockets=[listening])
        finally:
            await store.close()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    server = holder["server"]
    yield AdminServer(f"http://127.0.0.1:{port}", TOKEN, fleet)
    server.should_exit = True
    thread.join(10)
