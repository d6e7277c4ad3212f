"""A :class:`~llmgw.protocol.channels.Channel` over a Unix socket: one frame a line.

A control plane and its gateway workers, on one machine, talk over a socket
in the data dir that only its user opens (:func:`private_unix_socket`). Each
message is one frame (``encode`` makes it, ``decode`` reads it back) and ends
with a newline, so a frame holds none: the state protocol's are compact JSON
(``controlplane/statesharing/stateevents.py``); a frame with a newline is refused on
``send`` with ValueError.

It keeps the contract of :mod:`llmgw.protocol.channels` (checked by
``llmgw.testing.channel_conformance``, as for gRPC): in order both ways, a
``close`` on either side ends both after what was sent before it, ``peer``
names the other end (the socket's path on the connecting side, the
connecting process's pid on the listening side). Frames sent in one turn of
the event loop go out in one write (a full copy, a burst of changes), and
``send`` waits while more than :data:`WRITE_HIGH` bytes wait for the other
side to read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Generic, TypeVar

from llmgw.errors import ChannelClosed

LINE_MAX = 1 << 30
"""Longest frame (a full copy's keys or catalog can be large)."""
WRITE_HIGH = 1 << 20
"""Bytes that may wait to be read by the other side before ``send`` waits."""

T = TypeVar("T")
U = TypeVar("U")


class UnixChannel(Generic[T, U]):
    """One side of a stream over a connected Unix socket; see the module's text."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
        encode: Callable[[T], bytes],
        decode: Callable[[bytes], U],
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._peer = peer
        self._encode = encode
        self._decode = decode
        self._out = bytearray()
        self._flush_due = False
        self._closed = False
        """Closed on this side."""
        self._ended: str | None = None
        """Why the stream ended, once this side has seen it end."""

    @property
    def peer(self) -> str:
        return self._peer

    async def send(self, message: T) -> None:
        if self._closed or self._ended is not None:
            raise ChannelClosed(self._ended or "the stream is closed", "reconnect")
        frame = self._encode(message)
        if b"\n" in frame:
            raise ValueError("a frame of a Unix channel holds a newline (frames are lines)")
        self._out += frame
        self._out += b"\n"
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)
        if self._writer.transport.get_write_buffer_size() + len(self._out) > WRITE_HIGH:
            self._flush()
            try:
                await self._writer.drain()
            except ConnectionError as error:
                self._ended = f"the stream with {self._peer} broke ({error})"
                raise ChannelClosed(self._ended, "reconnect") from None

    def _flush(self) -> None:
        self._flush_due = False
        if self._out and not self._writer.is_closing():
            self._writer.write(bytes(self._out))
        self._out.clear()

    async def receive(self) -> U:
        if self._closed:
            raise ChannelClosed("the stream is closed", "reconnect")
        if self._ended is not None:
            raise ChannelClosed(self._ended, "reconnect")
        try:
            line = await self._reader.readline()
        except ConnectionError as error:
            line, why = b"", f"the stream with {self._peer} broke ({error})"
        except ValueError:  # longer than LINE_MAX: what follows cannot be told apart
            line, why = b"", f"{self._peer} sent a frame longer than {LINE_MAX} bytes"
            await self.close()
        else:
            why = f"{self._peer} closed the stream"
        if self._closed:
            raise ChannelClosed("the stream is closed", "reconnect")
        if not line.endswith(b"\n"):  # the end (a line cut short by it is not one)
            self._ended = why
            raise ChannelClosed(why, "reconnect")
        return self._decode(line[:-1])

    async def close(self) -> None:
        """End the stream for both sides: what was sent goes first; a receive waiting here wakes."""
        if self._closed:
            return
        self._closed = True
        self._flush()
        self._writer.close()
        self._reader.feed_eof()


def identity(frame: bytes) -> bytes:
    return frame


async def connect_unix(
    path: Path, encode: Callable[[T], bytes], decode: Callable[[bytes], U]
) -> UnixChannel[T, U]:
    """A channel to the socket at ``path``; ChannelClosed saying why when it cannot be reached."""
    try:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=LINE_MAX)
    except OSError as error:
        raise ChannelClosed(f"cannot reach {path} ({error})", "is its process running?") from None
    return UnixChannel(reader, writer, str(path), encode, decode)


class UnixServer(Generic[T, U]):
    """Listens on a socket and hands each connection, as a channel, to ``handler``."""

    def __init__(
        self,
        handler: Callable[[UnixChannel[T, U]], Awaitable[None]],
        encode: Callable[[T], bytes],
        decode: Callable[[bytes], U],
    ) -> None:
        self._handler = handler
        self._encode = encode
        self._decode = decode
        self._server: asyncio.Server | None = None
        self.channels: set[UnixChannel[T, U]] = set()
        """The channels open now."""

    async def start(self, sock: socket.socket) -> None:
        self._server = await asyncio.start_unix_server(self._connection, sock=sock, limit=LINE_MAX)

    async def close(self) -> None:
        """Stop listening and end every channel (their other sides see the end)."""
        if self._server is not None:
            self._server.close()
        for channel in list(self.channels):
            await channel.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = UnixChannel(reader, writer, _peer_of(writer), self._encode, self._decode)
        self.channels.add(channel)
        try:
            await self._handler(channel)
        finally:
            self.channels.discard(channel)
            await channel.close()


def _peer_of(writer: asyncio.StreamWriter) -> str:
    """The connecting process, as the kernel says (``pid N``), where it says."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(AttributeError, OSError):
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return f"pid {pid}"
    return "a local process"


def private_unix_socket(path: Path) -> socket.socket:
    """A listening Unix socket at ``path`` that only this user can connect to, from the first connection
    on: bound under a temporary name, made 0600, then renamed into place."""
    temporary = path.with_name(path.name + ".new")
    for leftover in (path, temporary):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(temporary))
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
