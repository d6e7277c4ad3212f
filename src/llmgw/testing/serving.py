"""Serving an ASGI app with uvicorn (httptools) on a free loopback port, for tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn


def bound_socket() -> socket.socket:
    """A listening socket on a free loopback port: clients may connect before the server runs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@asynccontextmanager
async def serving(app: Any, **config: Any) -> AsyncIterator[str]:
    """Serve ``app`` until the block ends; yields its base URL. ``config`` goes to ``uvicorn.Config``."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    settings = {
        "lifespan": "off",
        "log_level": "warning",
        "http": "httptools",
        "timeout_graceful_shutdown": 2,
    }
    server = uvicorn.Server(uvicorn.Config(app, **{**settings, **config}))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()
