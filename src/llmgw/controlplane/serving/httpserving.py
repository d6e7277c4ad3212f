"""The control plane's HTTP server: uvicorn, with readiness as an event and no signal handling of its own.

:attr:`HttpServer.listening` is set once the socket is bound and uvicorn's
startup is complete (no loop polling ``started``); :meth:`HttpServer.serve_until_stopped`
runs it as a component of the process supervisor, turning a socket that cannot
be bound into an error that says what to do, and :meth:`HttpServer.stop` ends it
gracefully (requests in flight finish).

Connections are bounded at the edge (:class:`GuardedHttpProtocol`, uvicorn's
httptools protocol with two additions), so that clients that open sockets and
send little or nothing cannot hold the process's descriptors, which the agents'
gRPC server shares:

- a request head (request line and headers) must arrive whole within
  ``http.header_timeout_s`` of the connection opening, or of the head's first
  byte on a kept-alive connection; otherwise the connection is closed
  (uvicorn times out only idle keep-alive connections, and not one that never
  sent a byte). The same time bounds the rest of a body the app answered
  without reading (a 401, a 413): it is read and dropped, so the client sees
  the answer rather than a reset (also when it asked for ``Connection:
  close``, which uvicorn alone would honour at once), then the connection is
  closed;
- at most ``http.max_connections`` are open. Past it a new connection takes the
  place of the one idle longest (waiting for its head, or kept alive between
  requests), so slow clients cannot lock others out; only when every connection
  has a request under way is the new one answered 503 and closed. uvicorn's own
  ``limit_concurrency`` is not used: it answers 503 only once a request head has
  arrived, so connections that never finish one are not bounded by it.

When the server stops (a restart hands its listening socket to the next
start), a connection accepted that has not yet sent a request is given
:data:`FIRST_HEAD_GRACE_S` for its head rather than closed at once: closed
with its request just arriving, its client would see a reset. A request that
comes is answered and the connection closed after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from llmgw.controlplane.config import HttpSettings
from llmgw.errors import ConfigError
from llmgw.gateway.paths import gateway_path

log = logging.getLogger(__name__)

DESCRIPTORS_BESIDE_HTTP = 1024
"""Descriptors kept free beside the HTTP connections: agents' streams, engines, the store, files."""

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]


def route_by_prefix(gateway: ASGIApp, other: ASGIApp) -> ASGIApp:
    """``/v1`` (and ``/rerank``) to the gateway without any framework in between; everything else to
    the admin app."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and gateway_path(scope["path"]):
            await gateway(scope, receive, send)
        else:
            await other(scope, receive, send)

    return app


class ConnectionGuard:
    """One server's connection limits, and its idle connections, the one idle longest first."""

    def __init__(self, settings: HttpSettings) -> None:
        self.header_timeout_s = settings.header_timeout_s
        self.keep_alive_s = settings.keep_alive_s
        self.max_connections = settings.max_connections
        self.idle: dict[GuardedHttpProtocol, None] = {}
        """Connections without a request under way and no byte of one yet (new, or kept alive),
        oldest first."""
        self.partial: dict[GuardedHttpProtocol, None] = {}
        """Connections with part of a request head, oldest first: a head that comes in pieces is
        slowloris's mark (a client's head nearly always arrives whole), so these go first."""
        self.timed_out = 0
        """Connections closed because their request head did not arrive in time."""
        self.evicted = 0
        """Idle connections closed to make room for a new one."""
        self.refused = 0
        """New connections answered 503 because every connection had a request under way."""

    def make_room(self, newcomer: GuardedHttpProtocol) -> bool:
        """Close the connection with part of a head for the longest, else the one idle longest (never
        ``newcomer``); False when every connection has a request under way."""
        for waiting in (self.partial, self.idle):
            for connection in waiting:
                if connection is newcomer or (waiting is self.idle and _head_waiting(connection)):
                    continue
                del waiting[connection]
                self.evicted += 1
                connection.transport.close()
                return True
        return False

    def busy(self, connection: GuardedHttpProtocol) -> None:
        """``connection`` has a whole request head: it is no candidate to close any more."""
        self.idle.pop(connection, None)
        self.partial.pop(connection, None)


def _head_waiting(connection: GuardedHttpProtocol) -> bool:
    """Whether a whole request head already waits in the connection's socket, not read yet: in a burst
    of new connections the server accepts many before it reads any, and a client's whole head (unlike
    a slow one's piece) marks a connection about to be served, never one to close."""
    sock = connection.transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        with socket.fromfd(sock.fileno(), socket.AF_INET, socket.SOCK_STREAM) as peeking:
            waiting = peeking.recv(_PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # nothing waiting (EAGAIN), or the socket is gone
        return False
    return b"\r\n\r\n" in waiting


_PEEK_BYTES = 16384
"""How much of a waiting head is looked at (a head longer than this counts as not whole)."""


def _refusal(max_connections: int) -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": f"this control plane holds its most HTTP connections ({max_connections}), "
                "each with a request under way",
                "hint": "try again shortly; if this load is expected, raise http.max_connections "
                "in server.yaml",
                "type": "service_unavailable",
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


FIRST_HEAD_GRACE_S = 0.5
"""When the server stops, how long a connection that has sent no request yet is given for one."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head timeout and a cap on connections.

    :attr:`guard` is set on a subclass made for each server (:func:`guarded_protocol`).
    """

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.guard.keep_alive_s  # type: ignore[assignment]  # a float is fine
        self._head_timer: asyncio.TimerHandle | None = None
        self._close_once_done = False
        """The client asked to close (``Connection: close``, HTTP/1.0): once answered and its body read."""
        self._body_done = False
        """The request's body has been read whole (by the app, or dropped after the answer)."""
        self._stopping = False
        """The server stops: a request still answered here closes the connection once done."""
        self._grace: asyncio.TimerHandle | None = None

    @property
    def stopping(self) -> bool:
        """The server has told this connection it stops (:meth:`shutdown`)."""
        return self._stopping

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.guard.idle[self] = None
        self._await_head()
        if len(self.connections) > self.guard.max_connections and not self.guard.make_room(self):
            self.guard.refused += 1
            self.guard.busy(self)
            self._stop_head_timer()
            transport.write(_refusal(self.guard.max_connections))
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        if self._grace is not None:
            self._grace.cancel()
        self.guard.busy(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self._await_head()  # the next request's head, or the rest of a body answered unread
            if self in self.guard.idle:  # a head begins (whole, it leaves both at once)
                del self.guard.idle[self]
                self.guard.partial[self] = None
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._await_head()  # a request pipelined behind another
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        self.guard.busy(self)
        super().on_headers_complete()
        self._body_done = False
        if (
            self.cycle is not None
            and self.cycle.scope is self.scope
            and (not self.cycle.keep_alive or self._stopping)
        ):
            # uvicorn would close as soon as the answer is sent, resetting a client still sending
            # its body: close once both are done instead (the rest of the body within the head timeout)
            self.cycle.keep_alive = True
            self._close_once_done = True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._body_done = True
        if self._close_once_done and self.cycle is not None and self.cycle.response_complete:
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._close_once_done:
            if self._body_done:
                self.transport.close()
        elif self.timeout_keep_alive_task is not None:  # kept alive, with nothing under way: idle
            self.guard.idle[self] = None

    def shutdown(self) -> None:
        """The server stops: a connection that has sent no request yet gets :data:`FIRST_HEAD_GRACE_S`
        for one (answered, then closed); any other is closed once its answer under way is sent."""
        self._stopping = True
        if self.cycle is None and not self.transport.is_closing():
            self._grace = self.loop.call_later(FIRST_HEAD_GRACE_S, self._no_request_came)
            return
        super().shutdown()

    def _no_request_came(self) -> None:
        self._grace = None
        if self.cycle is None and not self.transport.is_closing():
            self.transport.close()

    def _await_head(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.guard.header_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        self.guard.timed_out += 1
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # a pipelined head is late: close once the answer under way is sent
        elif not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedHttpProtocol]:
    """The protocol class uvicorn builds each of one server's connections with."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"guard": guard})


def raise_descriptor_limit(wanted: int) -> int:
    """Raise this process's soft descriptor limit to ``wanted`` (as far as the hard limit allows).

    The limit after; a warning says what to do when it stays below ``wanted``.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "this process may open %d descriptors, fewer than http.max_connections needs (%d): "
            "raise its limit (LimitNOFILE= in the systemd unit, or ulimit -n) or lower http.max_connections",
            soft,
            wanted,
        )
    return soft


def reuse_port_socket(host: str, port: int, listen: bool = True) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT``: every process of this user that binds
    the same port so shares its connections, the kernel spreading them over those listening.

    ``listen=False`` only holds the port (a socket that does not listen gets no connection): the
    control plane keeps one so that its workers, and those restarted later, bind the same port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
            sock.setblocking(False)
    except OSError as error:
        sock.close()
        raise ConfigError(
            f"cannot serve HTTP on {host}:{port}: {error.strerror}",
            hint="free that port or set http.port in server.yaml to one that is free",
        ) from error
    return sock


class HttpServer(uvicorn.Server):
    """uvicorn serving ``app`` on ``settings.host:settings.port`` (0: any free port), with its connection
    limits; the process wiring owns the signals.

    ``sock``: a socket already bound and listening to serve on instead (a gateway worker's
    :func:`reuse_port_socket`, or the control plane's Unix socket behind its workers), and ``port``
    the HTTP port to report then."""

    def __init__(
        self, app: ASGIApp, settings: HttpSettings, sock: socket.socket | None = None, port: int = 0
    ) -> None:
        self._sock = sock
        self._port = port
        self.guard = ConnectionGuard(settings)
        """This server's connection limits and counts."""
        super().__init__(
            uvicorn.Config(
                app,
                host=settings.host,
                port=settings.port,
                loop="none",
                http=guarded_protocol(self.guard),
                lifespan="off",
                log_level="warning",
                access_log=False,
            )
        )
        self._max_connections = settings.max_connections
        self.listening = asyncio.Event()
        """Set once the socket is bound and the server accepts connections."""
        self.ended = asyncio.Event()
        """Set once the server has stopped serving."""
        self.sockets: list[socket.socket] | None = None
        """Listening sockets to serve on instead of binding (one handed over across a restart)."""

    @property
    def port(self) -> int:
        """The port bound (known once :attr:`listening` is set)."""
        if self._sock is not None and self._sock.family == socket.AF_UNIX:
            return self._port
        return int(self.servers[0].sockets[0].getsockname()[1])

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: Any = None) -> None:
        raise_descriptor_limit(self._max_connections + DESCRIPTORS_BESIDE_HTTP)
        await super().startup(sockets)
        if self.started:
            self.listening.set()

    async def serve_until_stopped(self) -> None:
        """Serve until :meth:`stop`; ConfigError when the address cannot be bound."""
        try:
            await self.serve(self.sockets or (None if self._sock is None else [self._sock]))
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
