"""An HTTP client calling an ASGI app in memory, streaming its answer as the app sends it.

::

    async with asgi_client(gateway.asgi_app(), "http://gateway.test/v1") as http:  # httpx.AsyncClient
        sdk = AsyncOpenAI(base_url="http://gateway.test/v1", api_key=KEY, http_client=http)

httpx's own ``ASGITransport`` gathers the whole answer before it returns
(a stream held open by the app never returns, and a client cannot leave
mid-answer); :class:`StreamingAsgiTransport` hands the answer back once the
app started it and yields each body message as it is sent. Closing the
answer before its end (``stream.close()``, a cancelled request) tells the
app ``http.disconnect``, as a socket's close does. No socket is opened.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import httpx

Message = MutableMapping[str, Any]
App = Callable[..., Awaitable[None]]
"""An ASGI app: ``app(scope, receive, send)``."""


class _Body(httpx.AsyncByteStream):
    def __init__(
        self, chunks: asyncio.Queue[bytes | None], gone: asyncio.Event, task: asyncio.Task[None]
    ) -> None:
        self._chunks = chunks
        self._gone = gone
        self._task = task

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._chunks.get()) is not None:
            yield chunk

    async def aclose(self) -> None:
        self._gone.set()  # the app hears http.disconnect (nothing, when it already answered)


async def _run(
    app: App,
    scope: Message,
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    await app(scope, receive, send)


class StreamingAsgiTransport(httpx.AsyncBaseTransport):
    """Calls ``app`` for each request; the answer streams back as the app sends it."""

    def __init__(self, app: App, client: tuple[str, int] = ("127.0.0.1", 50000)) -> None:
        self.app = app
        self.client = client
        self._tasks: set[asyncio.Task[None]] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        url = request.url
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?")[0],
            "query_string": url.query,
            "server": (url.host, url.port or (443 if url.scheme == "https" else 80)),
            "client": self.client,
            "root_path": "",
        }
        loop = asyncio.get_running_loop()
        started: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = loop.create_future()
        chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        gone = asyncio.Event()
        read = False

        async def receive() -> Message:
            nonlocal read
            if not read:
                read = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                started.set_result((message["status"], list(message.get("headers", []))))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    chunks.put_nowait(message["body"])
                if not message.get("more_body", False):
                    chunks.put_nowait(None)

        def ended(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            chunks.put_nowait(None)
            if not started.done():
                error = None if task.cancelled() else task.exception()
                started.set_exception(error or RuntimeError("the app ended without answering"))

        task: asyncio.Task[None] = loop.create_task(_run(self.app, scope, receive, send))
        self._tasks.add(task)
        task.add_done_callback(ended)
        try:
            status, headers = await asyncio.shield(started)
        except BaseException:
            gone.set()  # the request was given up (cancelled): the app hears the client leave
            raise
        return httpx.Response(status, headers=headers, stream=_Body(chunks, gone, task), request=request)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)


@asynccontextmanager
async def asgi_client(
    app: App, base_url: str = "http://gateway.test", **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """An ``httpx.AsyncClient`` whose requests go to ``app`` in memory (``options`` go to the client)."""
    async with httpx.AsyncClient(
        transport=StreamingAsgiTransport(app), base_url=base_url, **options
    ) as client:
        yield client
