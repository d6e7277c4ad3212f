"""The control plane's HTTP server: uvicorn, with readiness as an event and no signal handling of its own.

:attr:`HttpServer.listening` is set once the socket is bound and uvicorn's
startup is complete (no loop polling ``started``); :meth:`HttpServer.serve_until_stopped`
runs it as a component of the process supervisor, turning a socket that cannot
be bound into an error that says what to do, and :meth:`HttpServer.stop` ends it
gracefully (requests in flight finish).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn

from llmgw.errors import ConfigError

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


class HttpServer(uvicorn.Server):
    """uvicorn serving ``app`` on ``host:port`` (0: any free port); the process wiring owns the signals."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        super().__init__(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                loop="none",
                http="httptools",
                lifespan="off",
                log_level="warning",
                access_log=False,
                timeout_keep_alive=75,
            )
        )
        self.listening = asyncio.Event()
        """Set once the socket is bound and the server accepts connections."""
        self.ended = asyncio.Event()
        """Set once the server has stopped serving."""

    @property
    def port(self) -> int:
        """The port bound (known once :attr:`listening` is set)."""
        return int(self.servers[0].sockets[0].getsockname()[1])

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()

    async def serve_until_stopped(self) -> None:
        """Serve until :meth:`stop`; ConfigError when the address cannot be bound."""
        try:
            await self.serve()
        except SystemExit as exited:  # uvicorn's answer to a socket it cannot bind
            config = self.config
            raise ConfigError(
                f"cannot serve HTTP on {config.host}:{config.port}",
                hint="free that port or set http.port in server.yaml to one that is free",
            ) from exited
        finally:
            self.ended.set()

    async def stop(self) -> None:
        """Stop accepting, let the requests in flight finish, and return once it has stopped."""
        self.should_exit = True
        if self.started:
            await self.ended.wait()
