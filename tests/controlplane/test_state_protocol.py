"""The state protocol's one server and one follower (stateprotocol.py), joined in memory: a full copy to
any number of followers, a gap or a bad frame ending in a new full copy, reconnection, bad requests
skipped. Their uses: test_state_stream.py (standbys), test_local_channel.py (workers, a real socket)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

import pytest

from llmgw.controlplane.statesharing.gatewaystate import QUEUE_MAX, GatewayState
from llmgw.controlplane.statesharing.stateevents import (
    Copy,
    Live,
    Request,
    ServerEvent,
    Serves,
    Wanted,
    encode,
)
from llmgw.controlplane.statesharing.stateprotocol import Follower, StateFollower, StateServer
from llmgw.core.backoff import Backoff
from llmgw.errors import ChannelClosed
from llmgw.gateway import Gateway, ReplicaEndpoint
from llmgw.protocol.channels import StateChannel, memory_state_pair
from llmgw.testing.eventually import eventually


def endpoint(replica_id: str) -> ReplicaEndpoint:
    return ReplicaEndpoint(replica_id, "m", f"http://127.0.0.1:1/{replica_id}", "rk", 2, "vllm")


class Part:
    """A server's part that keeps what it is told."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Request]] = []
        self.joined_: list[str] = []
        self.left_: list[str] = []
        self.go = True
        self.extra: list[ServerEvent] = []

    def joined(self, follower: Follower) -> None:
        self.joined_.append(follower.name)

    def left(self, follower: Follower) -> None:
        self.left_.append(follower.name)

    def take(self, follower: Follower, request: Request) -> None:
        self.requests.append((follower.name, request))

    def tick(self, follower: Follower) -> Sequence[ServerEvent]:
        return self.extra

    def going(self) -> bool:
        return self.go


class Told:
    """A follower's part that keeps the server's other events."""

    def __init__(self) -> None:
        self.events: list[ServerEvent] = []

    def told(self, event: ServerEvent) -> None:
        self.events.append(event)

    def tick(self) -> Sequence[Request]:
        return ()


class Leader:
    """A gateway, its state and a server publishing it; :meth:`connect` is a follower's way in."""

    def __init__(self) -> None:
        self.gateway = Gateway()
        self.part = Part()
        self.server = StateServer(GatewayState(self.gateway.feed), self.part, tick_s=0.05)
        self.served: list[asyncio.Task[None]] = []
        self.refused = False
        self.first: StateChannel | None = None
        """Served in place of the server on the next connection, once."""

    async def connect(self, name: str = "f1") -> StateChannel:
        if self.refused:
            raise ChannelClosed("the server is away", "retrying")
        mine, theirs = memory_state_pair()
        if self.first is not None:
            self.first, stand_in = None, self.first
            self.served.append(asyncio.create_task(_relay(theirs, stand_in)))
        else:
            self.served.append(asyncio.create_task(self.server.serve(theirs, name)))
        return mine


async def _relay(theirs: StateChannel, frames: StateChannel) -> None:
    """Sends what ``frames`` holds on ``theirs`` until either ends."""
    with contextlib.suppress(ChannelClosed):
        while True:
            await theirs.send(await frames.receive())


@contextlib.asynccontextmanager
async def following(leader: Leader, name: str = "f1") -> AsyncIterator[tuple[StateFollower, Gateway, Told]]:
    gateway, told = Gateway(), Told()
    follower = StateFollower(GatewayState(gateway.feed), told)
    task = asyncio.create_task(follower.run(lambda: leader.connect(name), Backoff(base=0.01, cap=0.05)))
    try:
        yield follower, gateway, told
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for served in leader.served:
            served.cancel()
        await asyncio.gather(*leader.served, return_exceptions=True)


async def test_every_follower_gets_a_full_copy_then_each_change() -> None:
    leader = Leader()
    leader.gateway.feed.replica_ready(endpoint("r1"))
    async with following(leader, "f1") as (one, first, _), following(leader, "f2") as (two, second, _):
        await eventually(lambda: one.connected and two.connected)
        assert sorted(leader.part.joined_) == ["f1", "f2"]
        assert first.replicas.get("r1") == second.replicas.get("r1") == endpoint("r1")
        leader.gateway.feed.replica_ready(endpoint("r2"))
        leader.gateway.feed.replica_gone("r1")
        await eventually(
            lambda: first.replicas.get("r2") is not None and second.replicas.get("r2") is not None
        )
        assert first.replicas.get("r1") is None and second.replicas.get("r1") is None
        assert len(leader.server.followers) == 2


async def test_a_follower_that_falls_behind_has_a_gap_and_resyncs_from_a_new_full_copy() -> None:
    leader = Leader()
    leader.gateway.feed.replica_ready(endpoint("r1"))
    async with following(leader) as (follower, gateway, _):
        await eventually(lambda: follower.connected)
        assert follower.connections == 1
        # more changes than a subscriber may fall behind by, before the server's sender runs again
        for n in range(QUEUE_MAX + 1):
            leader.gateway.feed.set_stopped(n % 2 == 0)
        leader.gateway.feed.replica_gone("r1")
        leader.gateway.feed.replica_ready(endpoint("r9"))
        await eventually(lambda: follower.connections == 2 and follower.connected)
        assert leader.part.left_ == ["f1"]  # its first stream was ended
        assert gateway.feed.stopped is leader.gateway.feed.stopped is True
        assert gateway.replicas.get("r1") is None  # the new copy did not name it: forgotten
        assert gateway.replicas.get("r9") == endpoint("r9")


async def test_a_frame_the_follower_cannot_read_ends_its_stream_and_it_resyncs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leader = Leader()
    leader.gateway.feed.replica_ready(endpoint("r2"))
    stand_in, frames = memory_state_pair()
    for frame in (encode(Copy(("r1",))), encode(Live()), b'{"kind": "replica_gone"}'):
        await frames.send(frame)
    leader.first = stand_in
    with caplog.at_level(logging.WARNING):
        async with following(leader) as (follower, gateway, _):
            await eventually(lambda: follower.connections == 2 and follower.connected)
            assert gateway.replicas.get("r2") == endpoint("r2")
    assert "lacks its field 'replica_id'" in caplog.text
    assert follower.holds_copy


async def test_requests_wait_while_no_stream_is_up_and_go_once_on_the_next() -> None:
    leader = Leader()
    leader.refused = True
    async with following(leader) as (follower, _, _):
        follower.request(Wanted("m"))
        follower.used("m")
        await asyncio.sleep(0.05)
        assert leader.part.requests == []
        leader.refused = False
        await eventually(lambda: len(leader.part.requests) == 2)
        await asyncio.sleep(0.05)
    assert sorted(r.kind for _, r in leader.part.requests) == ["used", "wanted"]


async def test_a_request_the_server_cannot_read_is_skipped_and_the_stream_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leader = Leader()
    mine = await leader.connect("f1")
    with caplog.at_level(logging.WARNING):
        await mine.send(b"\x00garbage")
        await mine.send(encode(Serves(True)))  # the server's to send
        await mine.send(encode(Wanted("m")))
        await eventually(lambda: leader.part.requests == [("f1", Wanted("m"))])
    assert "f1 sent a frame that cannot be read: a state frame is not JSON" in caplog.text
    assert "serves is the server's to send" in caplog.text
    assert len(leader.server.followers) == 1
    await mine.close()
    await eventually(lambda: leader.part.left_ == ["f1"])


async def test_the_servers_other_events_go_to_the_followers_part_and_going_ends_the_streams() -> None:
    leader = Leader()
    leader.part.extra = [Serves(True)]
    async with following(leader) as (follower, _, told):
        await eventually(lambda: follower.connected and Serves(True) in told.events)
        leader.part.go = False
        await eventually(lambda: leader.part.left_ == ["f1"])
        leader.part.go = True
        await eventually(lambda: follower.connections >= 2 and follower.connected)
