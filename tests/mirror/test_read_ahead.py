"""A fetch reads ahead of its writing, bounded, in order, and a transport's failure comes after what came."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from llmgw.errors import ChannelClosed
from llmgw.mirror.fetching import read_ahead
from llmgw.testing.eventually import eventually


async def test_chunks_come_in_order_and_no_more_than_the_depth_ahead_of_the_reader() -> None:
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for n in range(10):
            sent.append(n)
            yield bytes([n])

    ahead = read_ahead(chunks(), depth=3)
    assert await anext(ahead) == b"\x00"
    await eventually(lambda: len(sent) >= 4)
    assert len(sent) <= 1 + 3 + 1  # taken, queued, and one waiting to be queued
    assert [b async for b in ahead] == [bytes([n]) for n in range(1, 10)]


async def test_a_transport_failure_comes_out_after_the_chunks_before_it() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"
        raise ChannelClosed("the stream broke", "retrying")

    got: list[bytes] = []
    with pytest.raises(ChannelClosed, match="the stream broke"):
        async for chunk in read_ahead(chunks()):
            got.append(chunk)
    assert got == [b"a", b"b"]
