"""vLLM's KV-cache events: decode its msgpack batches, mirror an engine's blocks, follow its ZMQ socket.

vLLM (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": ...}'``) publishes three-frame messages ``[topic, sequence (8 bytes,
big-endian), payload]``. The payload is a msgspec ``KVEventBatch``, which
arrives in either of msgspec's encodings:

- positional arrays: ``[ts, events, data_parallel_rank?]``, each event
  ``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium]``, ``["BlockRemoved", block_hashes, medium]`` or
  ``["AllBlocksCleared"]``;
- maps: ``{"ts", "events", "data_parallel_rank"}``, each event a map with
  ``"type"`` and the fields by name.

A block hash is the 32-byte digest or the integer of its last eight bytes;
both become that integer (:func:`llmgw.core.kvblocks.block_key`).

A ``BlockStored`` event also says how many tokens a block holds
(``block_size``: 128 on vLLM's CPU backend, 16 on most GPU ones, 64 for some
MLA models) and which tokens its blocks hold (``token_ids``), with the
parent's hash and each block's extra keys (LoRA, images, cache salt). The
mirror keeps the block size the engine reports, and :class:`HashCheck`
hashes each plain block again as the gateway hashes prompts
(:func:`llmgw.core.kvblocks.block_digest` from the agent's
``PYTHONHASHSEED``): an engine whose hashes disagree (another hash
algorithm, another seed) is reported, since none of its blocks could ever
match a prompt.

:class:`BlockMirror` holds one engine's blocks and turns events into net
changes; :class:`KvEventsFollower` listens on the socket the engine connects
to (vLLM binds only a wildcard endpoint and connects to ``127.0.0.1``).

Sequence numbers count from 0. When one is skipped (a message lost, or sent
before the engine's connection was up) the follower asks vLLM's replay socket
(``replay_endpoint``, a ROUTER) for the missing batches: a DEALER sends
``[b"", start_seq]`` and receives ``[b"", seq, payload]`` for each batch the
engine still keeps (``buffer_steps``) from ``start_seq`` on, then
``[b"", END_SEQ, b""]``. The missing batches are applied in order, then the
message that showed the gap. Only when replay cannot fill the gap (the
buffer starts past it, ends first, answers malformed frames or nothing
within :data:`REPLAY_TIMEOUT_S`) is the mirror reset: what the lost messages
said is unknown, so the engine's blocks are known again only as it reports
them anew. A socket quiet for :data:`CATCH_UP_S` asks the replay socket for
anything after its last batch: a lost last message shows no gap, and a PUB
socket drops what it sends before its connection is up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from llmgw.agent import metrics
from llmgw.core.kvblocks import block_digest, block_key, none_hash
from llmgw.engines.vllm import HASH_SEED

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay's end marker: -1 as 8 signed big-endian bytes, as vLLM sends it."""
REPLAY_TIMEOUT_S = 1.0
"""How long a replay may take before the gap resets the mirror."""
CATCH_UP_S = 2.0
"""A socket quiet this long has the replay socket asked for anything after its last batch."""
RECEIVE_QUEUE = 100_000
"""Messages the SUB socket queues (vLLM's PUB high-water mark): what arrives during a replay waits."""


Events = list[tuple[str, list[int]]]
"""One batch's events, decoded: (kind, block keys)."""

HASHES_CHECKED = 64
"""Blocks :class:`HashCheck` hashes again per engine before it trusts the engine's hashing."""
MISMATCH_AFTER = 4
"""Blocks checked, none agreeing, after which an engine's hashing is reported as disagreeing."""


@dataclass(frozen=True)
class StoredBlocks:
    """What a ``BlockStored`` event says of its blocks besides their hashes."""

    block_size: int
    hashes: tuple[bytes | int, ...]
    parent: bytes | int | None
    tokens: tuple[int, ...]
    extra_keys: tuple[object, ...] | None = None
    """One entry per block (None for a plain one), or None when no block has any."""
    lora: bool = False
    """The blocks belong to a LoRA adapter's request (their hashes carry its name)."""


@dataclass(frozen=True)
class Decoded:
    """One batch: its events for the mirror, and its stores' details."""

    events: Events
    stored: tuple[StoredBlocks, ...] = ()


@dataclass
class BlockChanges:
    """What changed in an engine's cache: with ``reset``, ``stored`` is the whole new content."""

    stored: set[int] = field(default_factory=set)
    removed: set[int] = field(default_factory=set)
    reset: bool = False
    block_size: int = 0
    """Tokens per block as the engine last said; 0 while it has said nothing."""
    mismatch: str = ""
    """Why the engine's hashes disagree with llmgw's (:class:`HashCheck`); empty if they agree."""

    def __bool__(self) -> bool:
        return bool(self.stored or self.removed or self.reset)


def _field(event: Any, name: str, position: int) -> Any:
    if isinstance(event, dict):
        return event.get(name)
    return event[position] if len(event) > position else None


def decode_batch(payload: bytes) -> list[tuple[str, list[int]]]:
    """A batch's events as (kind, block keys): kinds BlockStored, BlockRemoved, AllBlocksCleared.

    Raises ValueError for a payload that is not a KV-event batch.
    """
    return decode(payload).events


def _stored(event: Any) -> StoredBlocks | None:
    """A BlockStored event's details; None where they cannot be read (the blocks still count)."""
    size, hashes = _field(event, "block_size", 4), _field(event, "block_hashes", 1)
    parent, tokens = _field(event, "parent_block_hash", 2), _field(event, "token_ids", 3)
    extra = _field(event, "extra_keys", 8)
    lora = _field(event, "lora_id", 5) is not None or _field(event, "lora_name", 7) is not None
    if not isinstance(size, int) or size < 1 or not isinstance(hashes, list) or not isinstance(tokens, list):
        return None
    if not all(isinstance(t, int) for t in tokens) or not all(isinstance(h, bytes | int) for h in hashes):
        return None
    if parent is not None and not isinstance(parent, bytes | int):
        return None
    return StoredBlocks(
        block_size=size,
        hashes=tuple(hashes),
        parent=parent,
        tokens=tuple(tokens),
        extra_keys=tuple(extra) if isinstance(extra, list) else None,
        lora=lora,
    )


def decode(payload: bytes) -> Decoded:
    """A batch's events (:func:`decode_batch`) and what each BlockStored says of its blocks.

    Raises ValueError for a payload that is not a KV-event batch.
    """
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError) as error:
        raise ValueError(f"a KV-event batch that is not msgpack: {error}") from None
    events = batch.get("events") if isinstance(batch, dict) else batch[1] if isinstance(batch, list) else None
    if not isinstance(events, list):
        raise ValueError("a KV-event batch without its events list")
    out: list[tuple[str, list[int]]] = []
    stored: list[StoredBlocks] = []
    for event in events:
        if isinstance(event, dict):
            kind = event.get("type")
        elif isinstance(event, list) and event:
            kind = event[0]
        else:
            raise ValueError(f"a KV event that is neither a tagged array nor a map: {event!r}")
        if kind == "AllBlocksCleared":
            out.append((kind, []))
        elif kind in ("BlockStored", "BlockRemoved"):
            hashes = _field(event, "block_hashes", 1) or []
            out.append((kind, [block_key(h) for h in hashes]))
            if kind == "BlockStored" and (details := _stored(event)) is not None:
                stored.append(details)
        else:
            log.debug("KV event %r ignored", kind)
    return Decoded(out, tuple(stored))


class HashCheck:
    """Whether an engine names its blocks as the gateway will hash prompts for it.

    Each plain block of a ``BlockStored`` event (no LoRA, no extra keys) is
    hashed again from its tokens, chained on its parent: the root for a
    prompt's first block, the parent's digest where the event carries digests
    or this check computed it before. Up to :data:`HASHES_CHECKED` blocks are
    checked; once one agrees the engine's hashing is known to be llmgw's, and
    while :data:`MISMATCH_AFTER` or more were checked and none agreed,
    :attr:`mismatch` says why its blocks can never match.
    """

    def __init__(self, seed: str) -> None:
        self.seed = seed
        self.root = none_hash(seed)
        self.agreed = 0
        self.disagreed = 0
        self._digests: dict[int, bytes] = {}
        self._sizes: set[int] = set()

    @property
    def done(self) -> bool:
        return self.agreed > 0 or self.agreed + self.disagreed >= HASHES_CHECKED

    @property
    def mismatch(self) -> str:
        if self.agreed or self.disagreed < MISMATCH_AFTER:
            return ""
        sizes = ", ".join(str(size) for size in sorted(self._sizes))
        return (
            f"none of the {self.disagreed} blocks checked has the hash llmgw computes for its tokens "
            f"(sha256_cbor, PYTHONHASHSEED={self.seed}, blocks of {sizes} tokens): the engine hashes "
            "with another algorithm or seed, so KV-aware routing never finds its blocks"
        )

    def see(self, stored: StoredBlocks) -> None:
        size = stored.block_size
        if self.done or len(stored.tokens) != size * len(stored.hashes):
            return
        self._sizes.add(size)
        parent: bytes | None
        if stored.parent is None:
            parent = self.root
        elif isinstance(stored.parent, bytes) and len(stored.parent) == 32:
            parent = stored.parent
        else:
            parent = self._digests.get(block_key(stored.parent))
        for index, external in enumerate(stored.hashes):
            plain = not stored.lora and (stored.extra_keys is None or stored.extra_keys[index] is None)
            given = external if isinstance(external, bytes) and len(external) == 32 else None
            if parent is None or not plain or self.done:
                parent = given or self._digests.get(block_key(external))
                continue
            digest = block_digest(parent, stored.tokens[index * size : (index + 1) * size])
            agreed = int.from_bytes(digest[-8:], "big") == block_key(external)
            metrics.KV_BLOCKS_CHECKED.labels("yes" if agreed else "no").inc()
            if agreed:
                self.agreed += 1
                if len(self._digests) < 4 * HASHES_CHECKED:
                    self._digests[block_key(external)] = digest
                parent = digest
            else:
                self.disagreed += 1
                parent = given


class BlockMirror:
    """One engine's KV blocks as its events describe them."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()
        self.block_size = 0
        """Tokens per block as the engine's last BlockStored said (0 before the first)."""

    def apply(self, events: list[tuple[str, list[int]]]) -> BlockChanges:
        """Apply decoded events; the net change (a block stored then removed is no change)."""
        changes = BlockChanges()
        for kind, keys in events:
            if kind == "AllBlocksCleared":
                self.blocks.clear()
                changes = BlockChanges(reset=True)
            elif kind == "BlockStored":
                for key in keys:
                    if key not in self.blocks:
                        self.blocks.add(key)
                        if key in changes.removed:
                            changes.removed.discard(key)
                        else:
                            changes.stored.add(key)
            else:
                for key in keys:
                    if key in self.blocks:
                        self.blocks.discard(key)
                        if key in changes.stored:
                            changes.stored.discard(key)
                        else:
                            changes.removed.add(key)
        return changes

    def reset(self) -> BlockChanges:
        """Forget everything (a gap in the events, or the engine restarted)."""
        self.blocks.clear()
        return BlockChanges(reset=True)

    def full_copy(self) -> BlockChanges:
        """Everything held, as a reset followed by the blocks (for a new stream)."""
        return BlockChanges(stored=set(self.blocks), reset=True, block_size=self.block_size)


class KvEventsFollower:
    """Follows one engine's KV-events socket, mirroring its blocks and reporting net changes.

    The SUB socket listens on ``endpoint`` (the engine connects to it). A
    message whose sequence number skips some (the first expected is 0) has the
    missing ones asked of ``replay_endpoint``; they are applied in order, then
    the message that showed the gap. While a replay is under way the SUB
    socket is not read: what arrives waits in ZMQ's queue, in order. A socket
    quiet for ``catch_up_s`` asks for anything newer (:meth:`catch_up`).
    """

    def __init__(
        self,
        endpoint: str,
        on_changes: Callable[[BlockChanges], None],
        topic: str = "",
        replay_endpoint: str | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
        catch_up_s: float = CATCH_UP_S,
        hash_seed: str = HASH_SEED,
    ) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.on_changes = on_changes
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_s = replay_timeout_s
        self.catch_up_s = catch_up_s
        self.mirror = BlockMirror()
        self.check = HashCheck(hash_seed)
        """Whether the engine's hashes are those llmgw computes (its blocks can match prompts)."""
        self.sequence = -1
        """The last sequence number applied (-1 before the first)."""
        self._received = -1
        """The last sequence number that came over the SUB socket."""
        self.gaps_replayed = 0
        """Sequence gaps filled from the engine's replay buffer."""
        self.gaps_reset = 0
        """Sequence gaps replay could not fill (each reset the mirror)."""
        self._told_mismatch = False

    async def receive(self, frames: list[bytes]) -> None:
        """Handle one ``[topic, sequence, payload]`` message (replaying what it shows missing)."""
        if len(frames) != 3 or len(frames[1]) != 8:
            log.warning("KV events from %s: a message of %d frames ignored", self.endpoint, len(frames))
            return
        sequence = int.from_bytes(frames[1], "big")
        if self._received < sequence <= self.sequence:
            self._received = sequence  # a catch-up replay applied it already
            return
        self._received = sequence
        expected = self.sequence + 1
        replayed: list[Decoded] = []
        reset = False
        if sequence > expected:
            batches, why = await self._fetch(expected, sequence - expected)
            if why or len(batches) < sequence - expected or batches[0][0] != expected:
                self.gaps_reset += 1
                metrics.KV_RESETS.inc()
                reset = True
                why = why or f"the engine keeps batches from {batches[0][0] if batches else sequence} on"
                log.warning(
                    "KV events from %s: batches %d to %d were lost and %s; the mirror is reset",
                    self.endpoint, expected, sequence - 1, why,
                )  # fmt: skip
            else:
                self.gaps_replayed += 1
                metrics.KV_GAPS_REPLAYED.inc()
                replayed = [decoded for _, decoded in batches]
                log.info(
                    "KV events from %s: batches %d to %d replayed",
                    self.endpoint, expected, sequence - 1,
                )  # fmt: skip
        elif sequence < expected:
            self.gaps_reset += 1
            metrics.KV_RESETS.inc()
            reset = True
            log.warning(
                "KV events from %s: batch %d after %d (the engine started over); the mirror is reset",
                self.endpoint, sequence, self.sequence,
            )  # fmt: skip
        self.sequence = sequence
        try:
            decoded = decode(frames[2])
        except ValueError as error:
            log.warning("KV events from %s: %s; the mirror is reset", self.endpoint, error)
            self._emit(self.mirror.reset())
            return
        self._apply([*replayed, decoded], reset)

    async def catch_up(self) -> None:
        """Ask the replay socket for anything after the last batch applied (a quiet socket's check).

        A PUB socket drops what it sends before its connection is up, and a
        lost last message shows no gap until the next one: this finds both.
        """
        if not self.replay_endpoint:
            return
        expected = self.sequence + 1
        batches, why = await self._fetch(expected, None)
        if why:
            log.debug("KV events from %s: no catch-up (%s)", self.endpoint, why)
            return
        if not batches:
            return
        reset = batches[0][0] != expected
        if reset:
            self.gaps_reset += 1
            metrics.KV_RESETS.inc()
            log.warning(
                "KV events from %s: batches %d to %d were lost and the engine keeps none of them; "
                "the mirror is reset",
                self.endpoint, expected, batches[0][0] - 1,
            )  # fmt: skip
        else:
            self.gaps_replayed += 1
            metrics.KV_GAPS_REPLAYED.inc()
            log.info(
                "KV events from %s: batches %d to %d caught up by replay",
                self.endpoint, expected, batches[-1][0],
            )  # fmt: skip
        self.sequence = batches[-1][0]
        self._apply([decoded for _, decoded in batches], reset)

    def _apply(self, batches: list[Decoded], reset: bool) -> None:
        """Apply batches in order and report the net change (with ``reset``: the whole mirror)."""
        if reset:
            self.mirror.reset()
        for batch in batches:
            for stored in batch.stored:
                self.mirror.block_size = stored.block_size
                self.check.see(stored)
        applied = self.mirror.apply([event for batch in batches for event in batch.events])
        if reset:
            self._emit(BlockChanges(stored=set(self.mirror.blocks), reset=True))
        elif applied:
            self._emit(applied)

    def _emit(self, changes: BlockChanges) -> None:
        changes.block_size = self.mirror.block_size
        mismatch = self.check.mismatch
        if mismatch and not changes.mismatch and not self._told_mismatch:
            log.warning("KV events from %s: %s", self.endpoint, mismatch)
            self._told_mismatch = True
        changes.mismatch = mismatch
        self.on_changes(changes)

    async def _fetch(self, first: int, count: int | None) -> tuple[list[tuple[int, Decoded]], str]:
        """Up to ``count`` batches (all, with None) the replay socket keeps from ``first`` on.

        They come decoded, with their sequence numbers, in order and without
        holes; the second item says why the answer is unusable ("" when it is).
        """
        if not self.replay_endpoint:
            return [], "the engine keeps none for replay"
        import zmq
        import zmq.asyncio

        socket = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.replay_endpoint)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.replay_timeout_s
        batches: list[tuple[int, Decoded]] = []
        try:
            await socket.send_multipart([b"", first.to_bytes(8, "big")])
            while count is None or len(batches) < count:
                left_ms = max(0, int((deadline - loop.time()) * 1000))
                if not left_ms or not await socket.poll(left_ms):
                    return batches, f"the replay did not answer within {self.replay_timeout_s:g} s"
                frames = await socket.recv_multipart()
                if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != 8:
                    return batches, f"the replay answered {len(frames)} frames, not [b'', seq, payload]"
                if frames[1] == END_SEQ:
                    break
                seq = int.from_bytes(frames[1], "big")
                if seq < first or (batches and seq != batches[-1][0] + 1):
                    return batches, f"the replay sent batch {seq} out of order"
                try:
                    batches.append((seq, decode(frames[2])))
                except ValueError as error:
                    return batches, f"replayed batch {seq} cannot be read ({error})"
        finally:
            socket.close(0)
        return batches, ""

    async def run(self) -> None:
        """Listen and follow until cancelled."""
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        socket.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        try:
            socket.bind(self.endpoint)
        except zmq.ZMQError as error:
            socket.close(0)
            log.error(
                "KV events: cannot listen on %s (%s); its blocks are unknown until the shard restarts",
                self.endpoint, error,
            )  # fmt: skip
            return
        try:
            while True:
                if await socket.poll(int(self.catch_up_s * 1000)):
                    await self.receive(await socket.recv_multipart())
                else:
                    await self.catch_up()
        finally:
            socket.close(0)
