"""A real admin API on a loopback port (uvicorn in a thread) for the console to talk to."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from llmgw.cli.adminclient import AdminClient
from llmgw.store.database import Store
from llmgw.testing.admin import admin_api

TOKEN = "llmgw-admin-console-test"


@pytest.fixture
def admin_client(tmp_path: Path) -> Iterator[AdminClient]:
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen()  # connections wait in the backlog until uvicorn accepts them
    port = listening.getsockname()[1]
    ready = threading.Event()
    holder: dict[str, uvicorn.Server] = {}

    async def serve() -> None:
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
        admin = admin_api(store, tmp_path, token=TOKEN)
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
    yield AdminClient(f"http://127.0.0.1:{port}", TOKEN)
    holder["server"].should_exit = True
    thread.join(10)
