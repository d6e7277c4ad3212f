"""A response's head and its first body write in one send: a connection's transport that holds the head.

uvicorn writes a response's head when the app sends ``http.response.start`` and its body when the
app sends ``http.response.body``: two ``send`` calls, two TCP segments over loopback and two
wake-ups of the client for nearly every answer, since an answer's body follows its head in the same
step of the app's task. :class:`HeadHolding` stands between a request's cycle and the connection's
transport, one for each request: its first write is held until the next
write, which goes out with it in one ``writelines`` (one ``writev``), or until the event loop's next
turn, whichever comes first, so a head whose body is not ready yet (a stream waiting for its first
token) is sent as soon as the app's step ends, as before.

Invariants: bytes leave in the order they were written; at most one write is held, never past the
loop's next turn; ``close`` sends what is held first; ``abort`` drops it, as the transport's own
buffer is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


class HeadHolding(asyncio.Transport):
    """A connection's transport, for one request's cycle, holding its response's head one turn."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._expecting = True
        """The next write is the response's head (the first of the request), to hold."""
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            assert self._flush is not None
            self._flush.cancel()
            self._flush = None
            self._transport.writelines((held, data))
        elif self._expecting:
            self._expecting = False
            self._held = bytes(data)
            self._flush = self._loop.call_soon(self._send_held)
        else:
            self._transport.write(data)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def _send_held(self) -> None:
        self._flush = None
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        if self._held is not None:
            if self._flush is not None:
                self._flush.cancel()
            self._send_held()
        self._transport.close()

    def abort(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        self._held = self._flush = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")
