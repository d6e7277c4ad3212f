"""The agent's KV reporter: a reset when a shard is first followed, net changes, full copies, gone shards."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

from llmgw.agent.kv_reporting import KvReporter
from llmgw.core.agentstream import AgentMessage
from llmgw.core.kvblocks import KvBlocksUpdate, block_key
from llmgw.core.shards import ShardSpec
from llmgw.testing.eventually import eventually
from llmgw.testing.kv_events_publisher import KvEventsPublisher


@dataclass
class FakeShard:
    spec: ShardSpec
    kv_events_port: int | None
    kv_replay_port: int | None = None


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_shards_blocks_go_up_as_resets_changes_and_full_copies() -> None:
    port, replay = _port(), _port()
    publisher = KvEventsPublisher(
        f"tcp://127.0.0.1:{port}",
        "kv-events",
        int_hashes=True,
        replay_endpoint=f"tcp://127.0.0.1:{replay}",
        block_size=32,
    )
    sent: asyncio.Queue[KvBlocksUpdate] = asyncio.Queue()
    shards = {"r1": FakeShard(ShardSpec(replica_id="r1", model="m"), port, replay)}

    def take(message: AgentMessage) -> None:
        assert isinstance(message, KvBlocksUpdate)
        sent.put_nowait(message)

    reporter = KvReporter(shards, take)
    try:
        reporter.sync()
        first = sent.get_nowait()
        assert (
            (first.model, first.replica_id) == ("m", "r1")
            and first.reset
            and first.block_size == 0  # not known before the engine's first stored block
            and first.hash_seed == "0"
        )
        digest = bytes(range(32))

        def reported() -> bool:
            publisher.stored([digest], None, [1] * 32)
            return not sent.empty()

        # until the subscription has reached the publisher
        await eventually(reported, timeout_s=10, interval_s=0.02, message="a stored block is reported")
        change = await sent.get()
        assert list(change.stored) == [block_key(digest)] and not change.reset
        assert change.block_size == 32  # the size the engine's event gave
        # What went before the engine's connection was up came by replay, not by a reset.
        follower = reporter.followers["r1"]
        assert follower.replay_endpoint == f"tcp://127.0.0.1:{replay}" and follower.gaps_reset == 0
        while not sent.empty():
            sent.get_nowait()
        reporter.resend()  # a new stream: the whole mirror again
        copy = sent.get_nowait()
        assert copy.reset and list(copy.stored) == [block_key(digest)] and copy.block_size == 32
        shards.clear()  # the shard went: its blocks are reset
        reporter.sync()
        gone = sent.get_nowait()
        assert gone.replica_id == "r1" and gone.reset and not gone.stored
    finally:
        shards.clear()
        reporter.sync()
        publisher.close()
