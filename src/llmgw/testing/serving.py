"""Serving an ASGI app with uvicorn (httptools) on a free loopback port, for tests."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
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


@contextmanager
def served_in_thread(open_app: Callable[[], AbstractAsyncContextManager[Any]]) -> Iterator[str]:
    """Serve the ASGI app ``open_app()`` yields, in a thread with an event loop of its own (where the
    app's resources, a store say, are opened and closed), for synchronous tests; yields its base URL."""
    started = threading.Event()
    stopping: list[asyncio.Event] = []
    address: list[str] = []
    failed: list[BaseException] = []

    async def main() -> None:
        try:
            async with open_app() as app, serving(app) as url:
                address.append(url)
                stopping.append(asyncio.Event())
                started.set()
                await stopping[0].wait()
        except BaseException as error:
            failed.append(error)
            started.set()
            raise

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not started.wait(30) or failed:
        raise RuntimeError(f"the app did not start within 30 s: {failed[0] if failed else 'no answer'}")
    try:
        yield address[0]
    finally:
        loop.call_soon_threadsafe(stopping[0].set)
        thread.join(30)
        loop.close()
