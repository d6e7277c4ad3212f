"""The gateway's HTTP client to replicas: one shared ``aiohttp.ClientSession`` per process.

The session is created lazily inside the running loop (a session is bound to
the loop it was made in) and closed by :meth:`Upstream.close`. aiohttp's
errors are translated here into :class:`Unreachable` (nothing came back: the
request may go to another replica) and left as they are once an answer started.
"""

from __future__ import annotations

import asyncio

import aiohttp

from llmgw.errors import EngineError
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.settings import GatewaySettings


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


def describe(error: BaseException) -> str:
    """A short, single-line reason for logs and hooks."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


class Upstream:
    """Sends requests to replicas over one pooled client session."""

    def __init__(self, settings: GatewaySettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> aiohttp.ClientSession:
        """The shared session, made on first use in the running loop."""
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._loop is not loop:
            session = self._session = self._new_session()
            self._loop = loop
        return session

    def _new_session(self) -> aiohttp.ClientSession:
        s = self._settings
        connector = aiohttp.TCPConnector(
            limit=s.max_connections,
            limit_per_host=0,
            keepalive_timeout=s.keepalive_s,
            ttl_dns_cache=60,
        )
        timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=s.connect_timeout_s, sock_read=s.upstream_timeout_s
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            trust_env=False,
            skip_auto_headers=("User-Agent",),
        )

    async def post(
        self, endpoint: ReplicaEndpoint, path: str, body: bytes, request_id: bytes
    ) -> aiohttp.ClientResponse:
        """POST ``body`` as received to ``endpoint``; returns once the status and headers are in.

        Raises :class:`Unreachable` when nothing came back and :class:`UpstreamTimeout`
        when the replica stayed silent.
        """
        headers = {
            "Authorization": "Bearer " + endpoint.api_key,
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",
            "x-request-id": request_id.decode("latin-1"),
        }
        try:
            return await self.session().post(
                endpoint.base_url + path, data=body, headers=headers, allow_redirects=False
            )
        except aiohttp.ClientConnectorError as exc:
            raise Unreachable(endpoint, describe(exc), connecting=True) from exc
        except aiohttp.ConnectionTimeoutError as exc:
            raise Unreachable(endpoint, "connect timed out", connecting=True) from exc
        except aiohttp.SocketTimeoutError as exc:
            raise UpstreamTimeout(
                f"replica {endpoint.replica_id} sent no answer within {self._settings.upstream_timeout_s:g} s"
            ) from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as exc:
            raise Unreachable(endpoint, describe(exc), connecting=False) from exc
        except aiohttp.ClientError as exc:  # e.g. a base_url that is no URL
            raise Unreachable(endpoint, describe(exc), connecting=True) from exc

    async def close(self) -> None:
        """Close the session and its pooled connections."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
