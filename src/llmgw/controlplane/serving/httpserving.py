"""The control plane's HTTP server: uvicorn, with readiness as an event and no signal handling of its own.

:attr:`HttpServer.listening` is set once the socket is bound and uvicorn's
startup is complete (no loop polling ``started``); :meth:`HttpServer.serve_until_stopped`
runs it as a component of the process supervisor, turning a socket that cannot
be bound into an error that says what to do, and :meth:`HttpServer.stop` ends it
gracefully (requests in flight finish).

Connections are bounded at the edge (:class:`GuardedHttpProtocol`, uvicorn's
httptools protocol with additions), so that clients that open sockets and
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
- a request body that did not come with its head must keep coming at
  ``http.body_min_bytes_per_s``, measured over each window of
  ``http.body_window_s`` after the first (a grace), and arrive whole within
  ``http.body_timeout_s`` plus a second per MiB received (a body sent at
  1 MiB/s or faster is never cut, whatever its size; a slow one cannot hold its
  connection long). A window in which the server held the body back (its app
  had not taken what came, a request ahead is still answered, the client waits
  for ``100 Continue``) does not count. Past either, the connection is answered
  408 (when nothing of an answer was sent) and closed;
- at most ``http.max_connections`` are open. Past it a new connection takes the
  place of one with part of a head, else of the one idle longest (waiting for
  its head, or kept alive between requests), else of the one whose body comes
  slowest (answered 503), so slow clients cannot lock others out; only when
  every connection has a request under way with its body whole is the new one
  answered 503 and closed. uvicorn's own
  ``limit_concurrency`` is not used: it answers 503 only once a request head has
  arrived, so connections that never finish one are not bounded by it.

A request asking to close (``Connection: close``, HTTP/1.0) behind others
pipelined on its connection is answered after them, in order, and the
connection closed after its answer; requests behind it are dropped unread
(uvicorn would close after the first answer, leaving those queued run but
unanswered, and run the ones behind).

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
from http import HTTPStatus
from typing import Any, ClassVar

import httptools
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from llmgw.controlplane.config import HttpSettings
from llmgw.controlplane.serving.headholding import HeadHolding
from llmgw.errors import ConfigError
from llmgw.gateway.api_errors import error_body
from llmgw.gateway.leaving import DEPARTURES, Departures
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
        self.body_min_bytes_per_s = settings.body_min_bytes_per_s
        self.body_window_s = settings.body_window_s
        self.body_timeout_s = settings.body_timeout_s
        self.idle: dict[GuardedHttpProtocol, None] = {}
        """Connections without a request under way and no byte of one yet (new, or kept alive),
        oldest first."""
        self.partial: dict[GuardedHttpProtocol, None] = {}
        """Connections with part of a request head, oldest first: a head that comes in pieces is
        slowloris's mark (a client's head nearly always arrives whole), so these go first."""
        self.receiving: dict[GuardedHttpProtocol, None] = {}
        """Connections whose request has a head and part of its body: past the cap, when no connection
        is idle, the one whose body comes slowest is closed."""
        self.timed_out = 0
        """Connections closed because their request head did not arrive in time."""
        self.evicted = 0
        """Idle connections closed to make room for a new one."""
        self.refused = 0
        """New connections answered 503 because every connection had a request under way."""
        self.slow_bodies = 0
        """Connections closed because their request body came too slowly, or not whole in time."""

    def make_room(self, newcomer: GuardedHttpProtocol) -> bool:
        """Close the connection with part of a head for the longest, else the one idle longest, else
        the one whose body comes slowest (never ``newcomer``); False when every connection has a
        request under way with its body whole.

        An idle connection goes before one receiving a body: closing it fails no request."""
        for waiting in (self.partial, self.idle):
            for connection in waiting:
                if connection is newcomer or (waiting is self.idle and _head_waiting(connection)):
                    continue
                del waiting[connection]
                self.evicted += 1
                connection.transport.close()
                return True
        slowest = min(self.receiving, key=GuardedHttpProtocol.body_rate, default=None)
        if slowest is None:
            return False
        self.evicted += 1
        slowest.cut_body(
            503,
            f"this control plane holds its most HTTP connections ({self.max_connections}) and closed "
            "this one, whose request body came slowest, to make room",
            "send the body at once after the head; if this load is expected, raise "
            "http.max_connections in server.yaml",
        )
        return True

    def busy(self, connection: GuardedHttpProtocol) -> None:
        """``connection`` has a whole request head: it is no candidate to close any more (until its
        body, if it has one, is found to be on its way: :attr:`receiving`)."""
        self.idle.pop(connection, None)
        self.partial.pop(connection, None)
        self.receiving.pop(connection, None)


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


def _closing_answer(status: int, body: bytes, retry: bool = False) -> bytes:
    """A whole JSON answer that closes the connection, written straight to the socket."""
    retry_after = "retry-after: 1\r\n" if retry else ""
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{retry_after}connection: close\r\n\r\n"
    )
    return head.encode() + body


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
    return _closing_answer(503, body, retry=True)


FIRST_HEAD_GRACE_S = 0.5
"""When the server stops, how long a connection that has sent no request yet is given for one."""

MIB = 1 << 20
"""A body's whole bound grows by a second per MiB received (``http.body_timeout_s``)."""


class _BodyClock:
    """How the body of the request being read comes, window by window (``http.body_window_s``)."""

    __slots__ = ("began", "counted_s", "held", "received", "timer", "window", "windows")

    def __init__(self, now: float) -> None:
        self.began = now
        self.window = 0
        """Bytes of the window under way."""
        self.received = 0
        """Bytes of the windows before it."""
        self.windows = 0
        """Windows counted against the client (the first is a grace)."""
        self.counted_s = 0.0
        """Their time: what the whole bound is measured against."""
        self.held = False
        """The server held the body back during this window (its reading paused): it does not count."""
        self.timer: asyncio.TimerHandle | None = None


class _NotRead(Exception):
    """Raised in the parser at a request behind one that asked to close: parsing stops there."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head and body timeouts, a cap on connections, and
    ``Connection: close`` honoured in order on a pipelined connection.

    :attr:`guard` is set on a subclass made for each server (:func:`guarded_protocol`).
    """

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.guard.keep_alive_s  # type: ignore[assignment]  # a float is fine
        self._head_timer: asyncio.TimerHandle | None = None
        self._closing: RequestResponseCycle | None = None
        """The request that asked to close (``Connection: close``, HTTP/1.0, or one come while the
        server stops): once it is answered and its body read, the connection closes. The requests
        ahead of it are answered first, in order; none behind it is read (:attr:`_after_close`)."""
        self._after_close = False
        """A request came behind :attr:`_closing`: it and all that follows are dropped unread."""
        self._body_done = False
        """The latest request's body has been read whole (by the app, or dropped after the answer)."""
        self._body_pending = False
        """The latest request has a head and not yet its whole body."""
        self._body_clock: _BodyClock | None = None
        self._stopping = False
        """The server stops: a request still answered here closes the connection once done."""
        self._grace: asyncio.TimerHandle | None = None
        self._departures = Departures()  # each request's scope names it: a request sees its client go

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
        self._stop_body_clock()
        if self._grace is not None:
            self._grace.cancel()
        self.guard.busy(self)
        super().connection_lost(exc)
        self._departures.left()

    def data_received(self, data: bytes) -> None:
        # uvicorn's, but for what follows a request that asked to close, and for the body's clock
        if self._after_close:
            return  # requests behind one that asked to close are not read
        if self.cycle is None or self.cycle.response_complete:
            self._await_head()  # the next request's head, or the rest of a body answered unread
            if self in self.guard.idle:  # a head begins (whole, it leaves both at once)
                del self.guard.idle[self]
                self.guard.partial[self] = None
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._after_close:
                return
            message = "Invalid HTTP request received."
            self.logger.warning(message)
            self.send_400_response(message)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._body_pending and self._body_clock is None:
            self._time_body()

    def on_message_begin(self) -> None:
        if self._closing is not None:
            # llhttp, told to be lenient after a close, would parse it and uvicorn run it unanswered
            self._after_close = True
            raise _NotRead
        self._await_head()  # a request pipelined behind another
        super().on_message_begin()
        self.scope["extensions"] = {DEPARTURES: self._departures}  # type: ignore[dict-item]

    def on_headers_complete(self) -> None:
        self._stop_head_timer()
        self.guard.busy(self)
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None or cycle.scope is not self.scope:
            return  # an upgrade
        cycle.transport = HeadHolding(self.transport, self.loop)  # the head and body in one send
        self._body_done = False
        self._body_pending = True
        if not cycle.keep_alive or self._stopping:
            # uvicorn would close as soon as the answer is sent, resetting a client still sending
            # its body, and before answering requests queued ahead of this one: close once this one is
            # answered and its body read instead (the rest of the body within the head timeout)
            cycle.keep_alive = True
            self._closing = cycle

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        clock = self._body_clock
        if clock is not None:
            clock.window += len(body)
            if self.flow.read_paused:  # the app has not taken what came yet
                clock.held = True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._body_done = True
        self._body_pending = False
        if self._body_clock is not None:
            self._stop_body_clock()
        # the latest request parsed is the one that asked to close, if any did: none is read behind it
        if self._closing is not None and self._closing.response_complete:
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next request queued, if one is
        closing = self._closing
        if closing is not None:
            if closing.response_complete and self._body_done:
                self.transport.close()
        elif self.timeout_keep_alive_task is not None:  # kept alive, with nothing under way: idle
            self.guard.idle[self] = None
        if self._body_clock is not None and self.cycle.response_complete:
            self._stop_body_clock()  # the rest of a body answered unread: dropped within the head timeout

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

    # -- the body's clock: a body that did not come with its head --------------------------------

    def body_rate(self) -> float:
        """Bytes per second the body under way has come at (infinite while the server holds it back)."""
        clock = self._body_clock
        if clock is None or self.flow.read_paused:
            return float("inf")
        return (clock.received + clock.window) / max(self.loop.time() - clock.began, 1e-3)

    def _time_body(self) -> None:
        if self.cycle.response_complete or self.transport.is_closing():
            return  # answered already: the head timer bounds the rest
        clock = self._body_clock = _BodyClock(self.loop.time())
        clock.timer = self.loop.call_later(self.guard.body_window_s, self._body_window_ended)
        self.guard.receiving[self] = None

    def _stop_body_clock(self) -> None:
        clock = self._body_clock
        if clock is not None:
            self._body_clock = None
            if clock.timer is not None:
                clock.timer.cancel()
            self.guard.receiving.pop(self, None)

    def _body_window_ended(self) -> None:
        clock = self._body_clock
        if clock is None:
            return
        guard = self.guard
        window_s = guard.body_window_s
        came, clock.window = clock.window, 0
        if clock.held or self.flow.read_paused or self.cycle.waiting_for_100_continue:
            clock.held = False  # the server held the body back (or the client waits for 100 Continue)
        else:
            clock.windows += 1
            clock.counted_s += window_s
            clock.received += came
            wanted = guard.body_min_bytes_per_s
            if clock.windows > 1 and came < wanted * window_s:
                guard.slow_bodies += 1
                self.cut_body(
                    408,
                    f"the request body came too slowly: {came / window_s:.0f} bytes/s over the last "
                    f"{window_s:g} s, under the {wanted} bytes/s this server asks",
                    "send the body at once after the head; an operator sets the rate with "
                    "http.body_min_bytes_per_s in server.yaml",
                )
                return
            bound_s = guard.body_timeout_s + clock.received / MIB
            if clock.counted_s > bound_s:
                guard.slow_bodies += 1
                self.cut_body(
                    408,
                    f"the request body did not arrive whole within {bound_s:.0f} s "
                    f"({guard.body_timeout_s:g} s, plus a second per MiB received)",
                    "send it faster, or in smaller requests; an operator sets the bound with "
                    "http.body_timeout_s in server.yaml",
                )
                return
        clock.timer = self.loop.call_later(window_s, self._body_window_ended)

    def cut_body(self, status: int, message: str, hint: str) -> None:
        """Close the connection for its request's body: answered ``status`` in the gateway's error shape
        when nothing of an answer was sent on it yet."""
        self._stop_body_clock()
        cycle = self.cycle
        if not cycle.response_started and not self.pipeline and not self.transport.is_closing():
            kind = "invalid_request_error" if status < 500 else "service_unavailable"
            code = "request_timeout" if status == 408 else "too_many_connections"
            self.transport.write(_closing_answer(status, error_body(message, kind, code, hint=hint)))
        cycle.disconnected = True  # what the app sends now goes nowhere; its receive() hears the client gone
        cycle.message_event.set()
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
                proxy_headers=False,  # nothing reads a forwarded client address; it cost each request
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
