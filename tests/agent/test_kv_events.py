"""vLLM's KV events: both msgpack encodings, net changes, resets on gaps, a real ZMQ publisher."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from llmgw.agent.kv_events import BlockChanges, BlockMirror, KvEventsFollower, decode_batch
from llmgw.core.kvblocks import block_key
from llmgw.testing.kv_events_publisher import KvEventsPublisher

DIGEST = bytes(range(32))


def _frames(sequence: int, payload: bytes) -> list[bytes]:
    return [b"", sequence.to_bytes(8, "big"), payload]


def test_positional_and_map_encodings_decode_alike() -> None:
    array = msgpack.packb(
        [
            1.5,
            [
                ["BlockStored", [1, DIGEST], None, [5, 6], 16, None, "GPU"],
                ["BlockRemoved", [1], "GPU"],
                ["AllBlocksCleared"],
            ],
        ]
    )
    as_map = msgpack.packb(
        {
            "ts": 1.5,
            "data_parallel_rank": None,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [1, DIGEST],
                    "parent_block_hash": None,
                    "token_ids": [5, 6],
                    "block_size": 16,
                    "lora_id": None,
                    "medium": "GPU",
                },
                {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"},
                {"type": "AllBlocksCleared"},
            ],
        }
    )
    expected = [("BlockStored", [1, block_key(DIGEST)]), ("BlockRemoved", [1]), ("AllBlocksCleared", [])]
    assert decode_batch(array) == decode_batch(as_map) == expected
    with pytest.raises(ValueError, match="events"):
        decode_batch(msgpack.packb({"ts": 1}))


def test_the_mirror_reports_net_changes() -> None:
    mirror = BlockMirror()
    changes = mirror.apply([("BlockStored", [1, 2, 3]), ("BlockRemoved", [2, 9])])
    assert changes == BlockChanges(stored={1, 3})
    changes = mirror.apply([("BlockRemoved", [1]), ("BlockStored", [1])])
    assert not changes  # removed then stored again: nothing changed
    assert mirror.full_copy() == BlockChanges(stored={1, 3}, reset=True)
    assert mirror.apply([("AllBlocksCleared", []), ("BlockStored", [7])]) == BlockChanges(
        stored={7}, reset=True
    )


def test_a_sequence_gap_resets_the_mirror() -> None:
    seen: list[BlockChanges] = []
    follower = KvEventsFollower("tcp://127.0.0.1:1", seen.append)
    follower.receive(_frames(4, msgpack.packb([0.0, [["BlockStored", [1, 2], None, [], 16, None, "GPU"]]])))
    follower.receive(_frames(6, msgpack.packb([0.0, [["BlockStored", [3], 2, [], 16, None, "GPU"]]])))
    assert follower.gaps == 1
    assert seen == [BlockChanges(stored={1, 2}), BlockChanges(stored={3}, reset=True)]
    follower.receive(_frames(7, b"\xc1"))  # not msgpack: the mirror is reset, never guessed at
    assert seen[-1] == BlockChanges(reset=True) and not follower.mirror.blocks


async def test_following_a_real_publisher() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    publisher = KvEventsPublisher(f"tcp://127.0.0.1:{port}", "", int_hashes=False)
    got: asyncio.Queue[BlockChanges] = asyncio.Queue()
    follower = KvEventsFollower(f"tcp://127.0.0.1:{port}", got.put_nowait)
    task = asyncio.create_task(follower.run())
    try:
        # A PUB socket drops what it sends before the subscription arrives: send until one is seen.
        async with asyncio.timeout(10):
            while got.empty():
                publisher.stored([DIGEST], None, [1] * 16)
                await asyncio.sleep(0.02)
        first = await got.get()
        assert first.stored == {block_key(DIGEST)}
        publisher.removed([DIGEST])
        async with asyncio.timeout(10):
            while True:
                changes = await got.get()
                if changes.removed:
                    break
        assert changes.removed == {block_key(DIGEST)} and not follower.mirror.blocks
    finally:
        task.cancel()
        publisher.close()
