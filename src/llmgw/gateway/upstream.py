"""The gateway's HTTP client to replicas: HTTP/1.1 keep-alive connections on asyncio protocols.

Why not aiohttp's ``ClientSession`` (which the gateway used first): profiled
under load, building and sending each request through it cost about a quarter
of the gateway's CPU, more than llmgw's own code; a request to a replica
needs none of its generality (redirects, cookies, proxies, compression). Here
a request is one ``writelines`` of a prebuilt head and the body as received,
and the answer is parsed by httptools (the parser uvicorn uses) straight into
the response.

Connections are pooled per replica address and reused for at most
``keepalive_s`` idle (below the engines' own keep-alive, so a reused
connection is never one the engine is closing). Errors are translated here:
:class:`Unreachable` (nothing came back: the request may go to another
replica), :class:`UpstreamTimeout` (the replica went silent) and
:class:`UpstreamDropped` (the connection broke mid-answer) and :class:`RequestTimedOut`
(the request's own time limit, its ``deadline``, ran out: the connection is closed
at that moment, so the engine stops working on it).

A provider outside the cluster (an endpoint with ``provider``, ``gateway/providers.py``)
is called the same way, over TLS when its URL is ``https://`` (the system's trust
store, and ``gateway.provider_ca_file`` for a private CA), with its own key header
(Anthropic's ``x-api-key``), the path under its base URL, and its own connect and
first-byte timeouts.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Protocol

import httptools

from llmgw.core.providers import ANTHROPIC_VERSION, ProviderApi
from llmgw.errors import ConfigError, EngineError
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.settings import GatewaySettings

HIGH_WATER = 1 << 20
"""Bytes of an answer buffered before reading from the replica pauses (a slow client)."""


class Unreachable(EngineError):
    """A replica gave no answer at all: refused, reset or closed before its first byte."""

    def __init__(self, endpoint: ReplicaEndpoint, reason: str, *, connecting: bool) -> None:
        super().__init__(f"replica {endpoint.replica_id} at {endpoint.base_url} unreachable: {reason}")
        self.endpoint = endpoint
        self.reason = reason
        self.connecting = connecting
        """True when no connection could be opened; False when an open one was dropped
        (which a connection the engine had just closed as idle can also cause)."""


class UpstreamTimeout(EngineError):
    """A replica accepted the request and then said nothing for ``upstream_timeout_s``."""


class UpstreamDropped(EngineError):
    """A replica's connection broke, or it sent what is not HTTP, before its answer was complete."""


class RequestTimedOut(EngineError):
    """A request's deadline (its model's ``request_timeout_s``) passed before its answer ended;
    the connection was closed then, which stops the engine's work on it."""


def describe(error: BaseException) -> str:
    """A short, single-line reason for logs and hooks."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


def retry_after(answer: object) -> list[tuple[bytes, bytes]] | None:
    """The ``Retry-After`` header of an upstream answer that sent one (a provider's 429), to pass on."""
    value = getattr(answer, "retry_after", "")
    return [(b"retry-after", value.encode("latin-1"))] if value else None


class UpstreamAnswer(Protocol):
    """A replica's answer as requests read it: status and content type at once, the body as it
    arrives; :meth:`release` (read to its end: the connection may be reused) or :meth:`close`
    (dropped: the replica sees the client is gone) ends it."""

    status: int
    content_type: str

    async def read(self) -> bytes:
        """The whole body (:class:`UpstreamTimeout`, :class:`UpstreamDropped` on failure)."""
        ...

    def iter_any(self) -> AsyncIterator[bytes]:
        """The body in pieces as they arrive."""
        ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class UpstreamClient(Protocol):
    """How the gateway calls replicas: :class:`Upstream` over HTTP, or an in-memory one in tests
    (:class:`llmgw.testing.gateway_doubles.MemoryUpstream`)."""

    async def post(
        self,
        endpoint: ReplicaEndpoint,
        path: str,
        body: bytes,
        request_id: bytes,
        traceparent: bytes = b"",
        deadline: float | None = None,
    ) -> UpstreamAnswer:
        """POST ``body`` to ``endpoint``; returns once the status and headers are in. Raises
        :class:`Unreachable` when nothing came back and :class:`UpstreamTimeout` when the
        replica stayed silent; past ``deadline`` (the event loop's time) the request is closed
        and its waits raise :class:`RequestTimedOut`."""
        ...

    async def close(self) -> None:
        """Let go of every connection (the process ends)."""
        ...


class UpstreamResponse:
    """A replica's answer: status and content type at once, the body as it arrives."""

    __slots__ = (
        "_chunks",
        "_connection",
        "_deadline",
        "_done",
        "_error",
        "_paused",
        "_size",
        "_timeout_s",
        "_waiter",
        "content_type",
        "keep_alive",
        "retry_after",
        "status",
    )

    def __init__(self, connection: _Connection, timeout_s: float) -> None:
        self._connection = connection
        self._timeout_s = timeout_s
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._done = False
        self._paused = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self.status = 0
        self.content_type = ""
        self.keep_alive = False
        self.retry_after = ""
        """The answer's ``Retry-After`` header (a provider's 429 or 503), empty when it sent none."""

    # -- fed by the connection ------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and not self._paused:
            self._paused = True
            self._connection.pause()
        self._wake()

    def _finish(self, error: BaseException | None = None) -> None:
        if self._done or self._error is not None:
            return
        if error is None:
            self._done = True
        else:
            self._error = error
        self._wake()

    def _expired(self) -> None:
        """The request's deadline passed: its waits fail, and the engine sees the request closed."""
        self._deadline = None
        if self._done:
            return
        connection = self._connection
        connection._fail(RequestTimedOut("the request's time limit ran out"))
        connection.abort()

    # -- read by the request --------------------------------------------------------------------

    async def _next(self) -> bytes:
        """The bytes arrived since the last call; b"" at the end of the answer."""
        while not self._chunks:
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            loop = self._connection.loop
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(self._timeout_s, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        if self._paused:
            self._paused = False
            self._connection.resume()
        return data

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self._next():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body in pieces as they arrive."""
        while chunk := await self._next():
            yield chunk

    def release(self) -> None:
        """Done with the answer: its connection goes back to the pool when it can be reused."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._connection.finished(self, reuse=self._done and self.keep_alive)

    def close(self) -> None:
        """Drop the connection (the replica sees the client is gone)."""
        if self._deadline is not None:
            self._deadline.cancel()
        self._connection.finished(self, reuse=False)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout("the replica stopped answering"))


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to a replica, answering one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.headers_done: asyncio.Future[None] | None = None
        self.lost = False
        self.idle_since = 0.0
        self.pool: list[_Connection] | None = None
        self._until_close = False

    # -- asyncio --------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes nobody asked for: this connection cannot be trusted
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(UpstreamDropped(f"the replica sent an unparsable answer ({error})"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        response = self.response
        if response is None:
            if self.pool is not None and self in self.pool:  # idle: the engine closed it
                self.pool.remove(self)
            return
        if self._until_close and exc is None and response.status:
            response._finish()  # a body delimited by the connection's end
            return
        reason = describe(exc) if exc is not None else "connection closed"
        self._fail(UpstreamDropped(f"the replica closed the connection ({reason})"))

    def _fail(self, error: BaseException) -> None:
        waiting = self.headers_done
        if waiting is not None and not waiting.done():
            waiting.set_exception(error)
        elif self.response is not None:
            self.response._finish(error)

    # -- httptools ------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._until_close = True

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-type":
            assert self.response is not None
            self.response.content_type = value.decode("latin-1")
        elif lowered == b"retry-after":
            assert self.response is not None
            self.response.retry_after = value.decode("latin-1")[:32]
        elif lowered in (b"content-length", b"transfer-encoding"):
            self._until_close = False  # the body's end is marked, not the connection's

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        parser = self.parser
        response.status = parser.get_status_code()
        response.keep_alive = parser.should_keep_alive()
        waiting = self.headers_done
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        self.response._finish()

    # -- the pool's side ------------------------------------------------------------------------

    def pause(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.lost = True

    def finished(self, response: UpstreamResponse, *, reuse: bool) -> None:
        if self.response is not response:
            return
        self.response = None
        self.headers_done = None
        if reuse and not self.lost and self.pool is not None:
            self.idle_since = time.monotonic()
            self.pool.append(self)
        else:
            self.abort()


class Upstream:
    """Sends requests to replicas over pooled keep-alive connections (an :class:`UpstreamClient`)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self._settings = settings
        self._pools: dict[tuple[str, int], list[_Connection]] = {}
        self._heads: dict[tuple[str, str, str], tuple[bytes, str, int]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tls: ssl.SSLContext | None = None

    def tls(self) -> ssl.SSLContext:
        """The TLS context providers are called with: the system's trust store, and the CA file set."""
        if self._tls is None:
            context = ssl.create_default_context()
            if self._settings.provider_ca_file:
                try:
                    context.load_verify_locations(cafile=self._settings.provider_ca_file)
                except (OSError, ssl.SSLError) as error:
                    raise ConfigError(
                        f"gateway.provider_ca_file {self._settings.provider_ca_file}: {describe(error)}",
                        "point it at a readable PEM file of the CA that signed the provider's certificate",
                    ) from None
            self._tls = context
        return self._tls

    def _head(self, endpoint: ReplicaEndpoint, path: str) -> tuple[bytes, str, int]:
        """The request's first lines (all but x-request-id and the length) and the replica's address."""
        key = (endpoint.base_url, endpoint.api_key, path)
        known = self._heads.get(key)
        if known is None:
            provider = endpoint.provider
            if not endpoint.base_url.startswith("http://") and provider is None:
                raise Unreachable(endpoint, "the gateway calls replicas over http:// only", connecting=True)
            if len(self._heads) > 4096:
                self._heads.clear()
            host, port = _address(endpoint)
            auth = f"Authorization: Bearer {endpoint.api_key}\r\n" if endpoint.api_key else ""
            if provider is not None:
                path = provider.path_prefix + path
                if provider.api is ProviderApi.ANTHROPIC:
                    auth = f"x-api-key: {endpoint.api_key}\r\n" if endpoint.api_key else ""
                    auth += f"anthropic-version: {ANTHROPIC_VERSION}\r\n"
            head = (
                f"POST {path} HTTP/1.1\r\nHost: {f'[{host}]' if ':' in host else host}:{port}\r\n"
                f"{auth}Content-Type: application/json\r\nAccept-Encoding: identity\r\n"
            ).encode("latin-1")
            known = self._heads[key] = (head, host, port)
        return known

    def _pooled(self, host: str, port: int) -> _Connection | None:  # http and https never share a port
        """An idle connection to ``host:port`` still fit for reuse, or None."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # connections belong to the loop they were made in
            self._pools.clear()
            self._loop = loop
        pool = self._pools.get((host, port))
        if not pool:
            return None
        oldest = time.monotonic() - self._settings.keepalive_s
        while pool:
            connection = pool.pop()
            if not connection.lost and connection.idle_since >= oldest:
                return connection
            connection.abort()
        return None

    async def _open(self, endpoint: ReplicaEndpoint, host: str, port: int) -> _Connection:
        """A new connection to ``host:port``."""
        loop = asyncio.get_running_loop()
        provider = endpoint.provider
        tls = self.tls() if provider is not None and provider.secure else None
        limit = provider.timeouts.connect_s if provider is not None else self._settings.connect_timeout_s
        try:
            async with asyncio.timeout(limit):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop), host, port, ssl=tls, server_hostname=host if tls else None
                )
        except TimeoutError as exc:
            raise Unreachable(endpoint, "connect timed out", connecting=True) from exc
        except ssl.SSLError as exc:  # an OSError too: named as TLS, the connection was made
            raise Unreachable(endpoint, f"TLS failed: {describe(exc)}", connecting=True) from exc
        except OSError as exc:
            raise Unreachable(endpoint, describe(exc), connecting=True) from exc
        connection.pool = self._pools.setdefault((host, port), [])
        return connection

    async def post(
        self,
        endpoint: ReplicaEndpoint,
        path: str,
        body: bytes,
        request_id: bytes,
        traceparent: bytes = b"",
        deadline: float | None = None,
    ) -> UpstreamResponse:
        """POST ``body`` as received to ``endpoint``; returns once the status and headers are in.

        ``traceparent`` (tracing on: the request's span, made by the gateway, never a
        client's bytes) is sent as the W3C header of that name; empty, no header is sent.
        ``deadline`` (the event loop's time; None: none): when it passes before the answer
        ended the connection is closed and the request's waits raise :class:`RequestTimedOut`.

        Raises :class:`Unreachable` when nothing came back and :class:`UpstreamTimeout`
        when the replica stayed silent.
        """
        head, host, port = self._head(endpoint, path)
        connection = self._pooled(host, port) or await self._open(endpoint, host, port)
        loop = connection.loop
        provider = endpoint.provider
        silence = (
            provider.timeouts.first_byte_s if provider is not None else self._settings.upstream_timeout_s
        )
        response = connection.response = UpstreamResponse(connection, silence)
        waiting = connection.headers_done = loop.create_future()
        assert connection.transport is not None
        if traceparent:
            request_id += b"\r\ntraceparent: " + traceparent
        connection.transport.writelines(
            (head, b"x-request-id: ", request_id, b"\r\nContent-Length: %d\r\n\r\n" % len(body), body)
        )
        if deadline is not None:
            response._deadline = loop.call_at(deadline, response._expired)
        timer = loop.call_later(silence, _expire, waiting)
        try:
            await waiting
        except UpstreamTimeout as exc:
            response.close()
            raise UpstreamTimeout(f"{_named(endpoint)} sent no answer within {silence:g} s") from exc
        except UpstreamDropped as exc:
            response.close()
            raise Unreachable(endpoint, describe(exc), connecting=False) from exc
        except BaseException:
            response.close()
            raise
        finally:
            timer.cancel()
        return response

    async def close(self) -> None:
        """Close every pooled connection."""
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            for connection in pool:
                connection.abort()


def _named(endpoint: ReplicaEndpoint) -> str:
    """How errors name the endpoint: its replica, or the provider of its model."""
    if endpoint.provider is not None:
        return f"the provider of model '{endpoint.model}'"
    return f"replica {endpoint.replica_id}"


def _address(endpoint: ReplicaEndpoint) -> tuple[str, int]:
    """Host and port of a replica's ``http://host:port`` base URL."""
    rest = endpoint.base_url.partition("://")[2] or endpoint.base_url
    hostport = rest.split("/", 1)[0]
    if hostport.startswith("["):  # [v6]:port
        host, _, port = hostport[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
    default = 443 if endpoint.base_url.startswith("https://") else 80
    return host, int(port) if port.isdigit() else default
