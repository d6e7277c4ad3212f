"""vLLM's KV events: both msgpack encodings, net changes, gaps replayed or reset, a real ZMQ publisher."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import msgpack
import pytest
import zmq
import zmq.asyncio

from llmgw.agent.kv_events import (
    END_SEQ,
    BlockChanges,
    BlockMirror,
    HashCheck,
    KvEventsFollower,
    decode,
    decode_batch,
)
from llmgw.agent.metrics import REGISTRY as AGENT_METRICS
from llmgw.core.kvblocks import block_key
from llmgw.testing.block_hashing import block_hash, external, none_hash
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
    # Each report carries the block size the engine's events gave (16 here).
    assert seen == [
        BlockChanges(stored={1, 2}, block_size=16),
        BlockChanges(stored={3}, reset=True, block_size=16),
    ]
    await follower.receive(_frames(1, _stored(4)))  # the sequence went back: the engine started over
    assert seen[-1] == BlockChanges(stored={4}, reset=True, block_size=16) and follower.gaps_reset == 2
    assert AGENT_METRICS.get_sample_value("llmgw_agent_kv_event_resets_total") == resets + 2
    await follower.receive(_frames(2, b"\xc1"))  # not msgpack: the mirror is reset, never guessed at
    assert seen[-1] == BlockChanges(reset=True, block_size=16) and not follower.mirror.blocks


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
        assert seen == [BlockChanges(stored={9}, block_size=16)] and follower.gaps_reset == 0
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
        assert seen[-1] == BlockChanges(stored={3}, reset=True, block_size=16)
        await follower.receive(_frames(3, _stored(4)))  # and it carries on
        assert seen[-1] == BlockChanges(stored={4}, block_size=16) and follower.mirror.blocks == {3, 4}
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


def _chain(tokens: list[int], size: int, seed: str = "0") -> list[bytes]:
    """The digests vLLM names a prompt's full blocks by (sha256_cbor, hashed the plain way)."""
    root, parent, out = none_hash(seed), None, []
    for start in range(0, len(tokens) - size + 1, size):
        parent = block_hash(parent, tokens[start : start + size], root)
        out.append(parent)
    return out


def _stored_event(
    hashes: list[bytes | int], parent: bytes | int | None, tokens: list[int], size: int, **fields: object
) -> bytes:
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
             "token_ids": tokens, "block_size": size, "lora_id": None, "medium": "CPU", **fields}  # fmt: skip
    return msgpack.packb({"ts": 0.0, "events": [event]})


def test_a_stored_event_gives_its_block_size_tokens_parent_and_extra_keys() -> None:
    tokens = list(range(256))
    digests = _chain(tokens, 128)
    decoded = decode(_stored_event(digests, None, tokens, 128, extra_keys=[["salt"], None]))
    [stored] = decoded.stored
    assert stored.block_size == 128 and stored.tokens == tuple(tokens) and stored.parent is None
    assert stored.hashes == tuple(digests) and stored.extra_keys == (["salt"], None) and not stored.lora
    assert decoded.events == [("BlockStored", [block_key(d) for d in digests])]


def test_the_check_agrees_with_an_engine_hashing_as_llmgw_does_in_digests_and_integers() -> None:
    tokens = list(range(1000, 1512))
    digests = _chain(tokens, 128)
    for as_int in (False, True):
        check = HashCheck("0")
        hashes = [external(d, as_int) for d in digests]
        # A prompt's first two blocks, then the next two chained on the second (its parent known
        # as a digest, or as the integer whose digest the check computed).
        check.see(decode(_stored_event(hashes[:2], None, tokens[:256], 128)).stored[0])
        check.see(decode(_stored_event(hashes[2:], hashes[1], tokens[256:], 128)).stored[0])
        assert (check.agreed, check.disagreed) == (1, 0) and check.done and not check.mismatch


def test_the_check_reports_an_engine_hashing_with_another_seed_and_skips_what_it_cannot_know() -> None:
    checked = AGENT_METRICS.get_sample_value("llmgw_agent_kv_blocks_checked_total", {"agreed": "no"}) or 0.0
    check = HashCheck("0")
    tokens = list(range(64))
    # A LoRA request's blocks and salted blocks carry extra keys llmgw does not hash: not checked.
    check.see(decode(_stored_event(_chain(tokens, 16), None, tokens, 16, lora_id=3)).stored[0])
    salted = _stored_event(_chain(tokens, 16), None, tokens, 16, extra_keys=[["s"], None, None, None])
    check.see(decode(salted).stored[0])
    assert check.disagreed == 0 and not check.mismatch  # the salted blocks after the first agree
    other = HashCheck("0")
    for start in range(0, 5):  # an engine started without PYTHONHASHSEED=0: every block differs
        part = tokens[start * 8 : start * 8 + 16]
        other.see(decode(_stored_event(_chain(part, 16, seed="1"), None, part, 16)).stored[0])
    assert other.disagreed == 5 and other.agreed == 0
    assert "none of the 5 blocks checked" in other.mismatch and "PYTHONHASHSEED=0" in other.mismatch
    assert "blocks of 16 tokens" in other.mismatch
    assert (
        AGENT_METRICS.get_sample_value("llmgw_agent_kv_blocks_checked_total", {"agreed": "no"}) == checked + 5
    )


async def test_the_follower_reports_the_engines_block_size_and_a_hash_mismatch() -> None:
    seen: list[BlockChanges] = []
    follower = KvEventsFollower("tcp://127.0.0.1:1", seen.append)
    tokens = list(range(128 * 5))
    wrong = _chain(tokens, 128, seed="random")
    for sequence in range(5):
        blocks = tokens[sequence * 128 : (sequence + 1) * 128]
        await follower.receive(_frames(sequence, _stored_event([wrong[sequence]], None, blocks, 128)))
    assert {report.block_size for report in seen} == {128}
    assert not seen[2].mismatch and "none of the 4 blocks" in seen[3].mismatch
