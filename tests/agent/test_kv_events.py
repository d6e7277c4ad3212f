"""vLLM's KV events: both msgpack encodings, net changes, gaps replayed or reset, a real ZMQ publisher."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import msgpack
import pytest
import zmq
import zmq.asyncio

from llmgw.agent.kv_events import END_SEQ, BlockChanges, BlockMirror, KvEventsFollower, decode_batch
from llmgw.agent.metrics import REGISTRY as AGENT_METRICS
from llmgw.core.kvblocks import block_key
from llmgw.testing.eventually import eventually
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


def _stored(*keys: int) -> bytes:
    return msgpack.packb([0.0, [["BlockStored", list(keys), None, [], 16, None, "GPU"]]])


async def test_a_gap_nothing_can_replay_resets_the_mirror() -> None:
    resets = AGENT_METRICS.get_sample_value("llmgw_agent_kv_event_resets_total") or 0.0
    seen: list[BlockChanges] = []
    follower = KvEventsFollower("tcp://127.0.0.1:1", seen.append)  # no replay endpoint
    await follower.receive(_frames(0, _stored(1, 2)))
    await follower.receive(_frames(2, _stored(3)))
    assert (follower.gaps_replayed, follower.gaps_reset) == (0, 1)
    assert seen == [BlockChanges(stored={1, 2}), BlockChanges(stored={3}, reset=True)]
    await follower.receive(_frames(1, _stored(4)))  # the sequence went back: the engine started over
    assert seen[-1] == BlockChanges(stored={4}, reset=True) and follower.gaps_reset == 2
    assert AGENT_METRICS.get_sample_value("llmgw_agent_kv_event_resets_total") == resets + 2
    await follower.receive(_frames(2, b"\xc1"))  # not msgpack: the mirror is reset, never guessed at
    assert seen[-1] == BlockChanges(reset=True) and not follower.mirror.blocks


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Engine:
    """A stand-in publisher with a replay socket, the blocks it really holds, and a follower of it."""

    def __init__(self, buffer_steps: int = 10_000, catch_up_s: float = 2.0) -> None:
        port, replay = _port(), _port()
        self.publisher = KvEventsPublisher(
            f"tcp://127.0.0.1:{port}", "", int_hashes=True,
            replay_endpoint=f"tcp://127.0.0.1:{replay}", buffer_steps=buffer_steps,
        )  # fmt: skip
        self.truth: set[int] = set()
        self.seen: list[BlockChanges] = []
        self.reported = asyncio.Event()
        self.follower = KvEventsFollower(
            f"tcp://127.0.0.1:{port}", self.report, replay_endpoint=f"tcp://127.0.0.1:{replay}",
            catch_up_s=catch_up_s,
        )  # fmt: skip
        self.task = asyncio.create_task(self.follower.run())
        self.digests = 0

    def report(self, changes: BlockChanges) -> None:
        self.seen.append(changes)
        self.reported.set()

    def store(self) -> int:
        self.digests += 1
        digest = self.digests.to_bytes(32, "big")
        self.publisher.stored([digest], None, [1] * 16)
        key = block_key(digest)
        self.truth.add(key)
        return key

    def remove(self, key: int) -> None:
        self.publisher.removed([key.to_bytes(32, "big")])
        self.truth.discard(key)

    async def joined(self) -> None:
        """Publish until the follower has seen something (a PUB drops what precedes the connection)."""

        def seen() -> bool:
            self.store()
            return self.follower.sequence >= 0

        await eventually(seen, timeout_s=10, interval_s=0.02, message="the follower sees a published block")

    async def applied(self) -> None:
        """Until the follower has handled everything published (each batch here changes something)."""
        async with asyncio.timeout(10):
            while self.follower.sequence < self.publisher.sequence - 1:
                self.reported.clear()
                await self.reported.wait()

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.publisher.close()


async def test_lost_messages_are_replayed_in_order_and_the_mirror_keeps_the_truth() -> None:
    engine = Engine()
    try:
        await engine.joined()
        await engine.applied()
        joined = engine.follower.gaps_replayed  # 1 where the first batches went before the connection
        replayed = AGENT_METRICS.get_sample_value("llmgw_agent_kv_event_gaps_replayed_total") or 0.0
        asked = engine.publisher.replays
        base = engine.publisher.sequence
        engine.publisher.lose(base + 1, base + 2, base + 7)
        keys = [engine.store() for _ in range(10)]  # sent in one burst: the rest queue during each replay
        engine.remove(keys[1])  # removes a block only a lost message stored
        engine.remove(keys[4])
        await engine.applied()
        assert engine.follower.mirror.blocks == engine.truth
        assert (engine.follower.gaps_replayed - joined, engine.follower.gaps_reset) == (2, 0)
        assert AGENT_METRICS.get_sample_value("llmgw_agent_kv_event_gaps_replayed_total") == replayed + 2
        assert engine.publisher.replays - asked == 2  # one request per gap
    finally:
        await engine.close()


async def test_a_gap_older_than_the_buffer_resets_and_reports_the_whole_mirror() -> None:
    engine = Engine(buffer_steps=2)
    try:
        await engine.joined()
        await engine.applied()
        engine.seen.clear()
        early = set(engine.truth)
        joined = engine.follower.gaps_reset  # 1 where the first batches went before the connection
        base = engine.publisher.sequence
        engine.publisher.lose(base)
        keys = [engine.store() for _ in range(4)]  # the buffer keeps only the last two: base is gone
        await engine.applied()
        assert (engine.follower.gaps_replayed, engine.follower.gaps_reset - joined) == (0, 1)
        resets = [report for report in engine.seen if report.reset]
        assert len(resets) == 1 and resets[0].stored == set(keys[1:2])  # the whole mirror then: base + 1
        assert engine.follower.mirror.blocks == set(keys[1:])  # what came before the gap is unknown
        assert early and not early & engine.follower.mirror.blocks
    finally:
        await engine.close()


async def test_a_lost_last_message_is_caught_up_while_the_socket_is_quiet() -> None:
    engine = Engine(catch_up_s=0.2)
    try:
        await engine.joined()
        await engine.applied()
        replayed = engine.follower.gaps_replayed
        engine.publisher.lose(engine.publisher.sequence)
        engine.store()  # nothing follows it: no gap shows until the quiet socket's check
        await engine.applied()
        assert engine.follower.mirror.blocks == engine.truth
        assert (engine.follower.gaps_replayed - replayed, engine.follower.gaps_reset) == (1, 0)
    finally:
        await engine.close()


async def test_a_batch_caught_up_by_replay_is_not_applied_twice() -> None:
    replay = _port()
    publisher = KvEventsPublisher(
        f"tcp://127.0.0.1:{_port()}", "", replay_endpoint=f"tcp://127.0.0.1:{replay}"
    )
    seen: list[BlockChanges] = []
    follower = KvEventsFollower("tcp://127.0.0.1:1", seen.append, replay_endpoint=f"tcp://127.0.0.1:{replay}")
    try:
        await follower.catch_up()  # nothing published yet: nothing to do
        assert (follower.sequence, seen) == (-1, [])
        publisher.stored([DIGEST], None, [1] * 16)  # batch 0, reaching nobody over PUB
        publisher.removed([DIGEST])  # batch 1
        await follower.catch_up()
        assert follower.sequence == 1 and not seen and follower.gaps_replayed == 1  # stored then removed
        await follower.receive(
            _frames(1, msgpack.packb([0.0, [["BlockRemoved", [block_key(DIGEST)], "GPU"]]]))
        )
        await follower.receive(_frames(2, _stored(9)))  # batch 1 again over SUB: skipped, not a restart
        assert seen == [BlockChanges(stored={9})] and follower.gaps_reset == 0
    finally:
        publisher.close()


@pytest.mark.parametrize(
    "answer",
    [
        [[b"", b"\x00\x01", b"x"]],  # a sequence number that is not 8 bytes
        [[b"", (1).to_bytes(8, "big"), b"\xc1"]],  # a payload that is not msgpack
        [[b"", END_SEQ, b""]],  # the end before the missing batch
        [],  # no answer at all
    ],
    ids=["short-seq", "bad-payload", "end-first", "silent"],
)
async def test_a_replay_that_cannot_fill_the_gap_resets_the_mirror(answer: list[list[bytes]]) -> None:
    replay = _port()
    context = zmq.asyncio.Context.instance()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://127.0.0.1:{replay}")
    requests: list[list[bytes]] = []

    async def serve() -> None:
        client, *request = await router.recv_multipart()
        requests.append(request)
        for frames in answer:
            await router.send_multipart([client, *frames])

    server = asyncio.create_task(serve())
    seen: list[BlockChanges] = []
    follower = KvEventsFollower(
        "tcp://127.0.0.1:1", seen.append, replay_endpoint=f"tcp://127.0.0.1:{replay}", replay_timeout_s=0.3
    )
    try:
        await follower.receive(_frames(0, _stored(1, 2)))
        await follower.receive(_frames(2, _stored(3)))
        assert requests == [[b"", (1).to_bytes(8, "big")]]
        assert (follower.gaps_replayed, follower.gaps_reset) == (0, 1)
        assert seen[-1] == BlockChanges(stored={3}, reset=True)
        await follower.receive(_frames(3, _stored(4)))  # and it carries on
        assert seen[-1] == BlockChanges(stored={4}) and follower.mirror.blocks == {3, 4}
    finally:
        server.cancel()
        router.close(0)


async def test_a_replay_request_of_the_wrong_shape_is_ignored() -> None:
    replay = _port()
    publisher = KvEventsPublisher(
        f"tcp://127.0.0.1:{_port()}", "", replay_endpoint=f"tcp://127.0.0.1:{replay}"
    )
    publisher.stored([DIGEST], None, [1] * 16)
    dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{replay}")
    try:
        await dealer.send_multipart([b"", b"\x00" * 8, b"extra"])
        assert not await dealer.poll(200)
        await dealer.send_multipart([b"", b"\x00" * 8])
        assert await dealer.poll(5000)
        assert (await dealer.recv_multipart())[1] == b"\x00" * 8
        assert await dealer.recv_multipart() == [b"", END_SEQ, b""]
        assert publisher.replays == 1
    finally:
        dealer.close(0)
        publisher.close()


async def test_following_a_real_publisher() -> None:
    port = _port()
    publisher = KvEventsPublisher(f"tcp://127.0.0.1:{port}", "", int_hashes=False)
    got: asyncio.Queue[BlockChanges] = asyncio.Queue()
    follower = KvEventsFollower(f"tcp://127.0.0.1:{port}", got.put_nowait)
    task = asyncio.create_task(follower.run())
    try:
        # A PUB socket drops what it sends before the connection is up: send until one is seen.

        def seen() -> bool:
            publisher.stored([DIGEST], None, [1] * 16)
            return not got.empty()

        await eventually(seen, timeout_s=10, interval_s=0.02, message="the follower sees a published block")
        first = await got.get()
        assert block_key(DIGEST) in first.stored
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
