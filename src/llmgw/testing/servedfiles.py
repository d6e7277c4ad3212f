"""What the fake registries share: an aiohttp app on 127.0.0.1 (in the test's loop or a thread of
its own), files served with ``Range``, a download cut once on purpose, and a log of requests."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass(frozen=True)
class Seen:
    """One request as the server received it."""

    method: str
    path: str
    range: str
    authorized: bool
    """Whether it carried an ``Authorization`` header."""


def offsets(seen: list[Seen], path: str) -> list[int]:
    """Where each request for ``path`` asked to start (0: no ``Range``), in order."""
    return [
        int(match.group(1)) if (match := _RANGE.fullmatch(s.range)) else 0 for s in seen if s.path == path
    ]


@dataclass
class Cuts:
    """Downloads to cut once: after how many bytes, by a file's key (path or digest)."""

    once: dict[str, int] = field(default_factory=dict)

    def take(self, key: str) -> int | None:
        return self.once.pop(key, None)


async def serve_bytes(
    request: web.Request, data: bytes, headers: dict[str, str], cut_after: int | None = None
) -> web.StreamResponse:
    """``data`` (200, or 206 for ``Range: bytes=A-[B]``), cut after ``cut_after`` bytes if given."""
    start, end = 0, len(data) - 1
    status = 200
    wanted = request.headers.get("Range", "")
    if match := _RANGE.fullmatch(wanted):
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) else len(data) - 1
        if start >= len(data) or end < start:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{len(data)}"})
        status = 206
        headers = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
    body = data[start : end + 1]
    answer = web.StreamResponse(status=status, headers={**headers, "Accept-Ranges": "bytes"})
    answer.content_length = len(body)
    await answer.prepare(request)
    if request.method == "HEAD":
        return answer
    if cut_after is not None and cut_after < len(body):
        await answer.write(body[:cut_after])
        assert request.transport is not None
        answer.force_close()
        request.transport.write_eof()  # what was written still goes out, then the stream ends short
        return answer
    await answer.write(body)
    await answer.write_eof()
    return answer


class AppServer:
    """An aiohttp app on a free port of 127.0.0.1: ``async with`` in a test's loop, ``with`` in a thread."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def app(self) -> web.Application:
        @web.middleware
        async def record(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            self.seen.append(
                Seen(
                    request.method,
                    request.path,
                    request.headers.get("Range", ""),
                    "Authorization" in request.headers,
                )
            )
            return await handler(request)

        app = web.Application(middlewares=[record])
        self.routes(app)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> AppServer:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    def __enter__(self) -> AppServer:
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self.start())
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self.stop())
            self._loop.close()

        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError(f"{type(self).__name__} did not start within 10 s")
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
