"""The Unix-socket channel beyond the contract every channel keeps (test_channel_conformance.py): frames
are lines, and a socket that is not there is a ChannelClosed saying so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmgw.errors import ChannelClosed
from llmgw.protocol.unix_transport import UnixChannel, UnixServer, connect_unix, identity, private_unix_socket


async def test_a_frame_holding_a_newline_is_refused_and_nothing_of_it_is_sent(tmp_path: Path) -> None:
    arrived: asyncio.Queue[UnixChannel[bytes, bytes]] = asyncio.Queue()
    done = asyncio.Event()

    async def session(channel: UnixChannel[bytes, bytes]) -> None:
        await arrived.put(channel)
        await done.wait()

    server: UnixServer[bytes, bytes] = UnixServer(session, identity, identity)
    await server.start(private_unix_socket(tmp_path / "s.sock"))
    channel = await connect_unix(tmp_path / "s.sock", identity, identity)
    try:
        other = await asyncio.wait_for(arrived.get(), 5)
        with pytest.raises(ValueError, match="holds a newline"):
            await channel.send(b"two\nlines")
        await channel.send(b"one line")
        assert await asyncio.wait_for(other.receive(), 5) == b"one line"
    finally:
        done.set()
        await channel.close()
        await server.close()


async def test_a_socket_that_is_not_there_is_channel_closed(tmp_path: Path) -> None:
    with pytest.raises(ChannelClosed, match=r"cannot reach .*gone\.sock"):
        await connect_unix(tmp_path / "gone.sock", identity, identity)
