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
from llmgw.core.kvblocks import block_key

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


@dataclass
class BlockChanges:
    """What changed in an engine's cache: with ``reset``, ``stored`` is the whole new content."""

    stored: set[int] = field(default_factory=set)
    removed: set[int] = field(default_factory=set)
    reset: bool = False

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
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError) as error:
        raise ValueError(f"a KV-event batch that is not msgpack: {error}") from None
    events = batch.get("events") if isinstance(batch, dict) else batch[1] if isinstance(batch, list) else None
    if not isinstance(events, list):
        raise ValueError("a KV-event batch without its events list")
    out: list[tuple[str, list[int]]] = []
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
        else:
            log.debug("KV event %r ignored", kind)
    return out


class BlockMirror:
    """One engine's KV blocks as its events describe them."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()

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
        return BlockChanges(stored=set(self.blocks), reset=True)


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
    ) -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.on_changes = on_changes
        self.replay_endpoint = replay_endpoint
        self.replay_timeout_s = replay_timeout_s
        self.catch_up_s = catch_up_s
        self.mirror = BlockMirror()
        self.sequence = -1
        """The last sequence number applied (-1 before the first)."""
        self._received = -1
        """The last sequence number that came over the SUB socket."""
        self.gaps_replayed = 0
        """Sequence gaps filled from the engine's replay buffer."""
        self.gaps_reset = 0
        """Sequence gaps replay could not fill (each reset the mirror)."""

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
        replayed: list[Events] = []
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
                replayed = [events for _, events in batches]
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
            events = decode_batch(frames[2])
        except ValueError as error:
            log.warning("KV events from %s: %s; the mirror is reset", self.endpoint, error)
            self.on_changes(self.mirror.reset())
            return
        self._apply([*replayed, events], reset)

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
        self._apply([events for _, events in batches], reset)

    def _apply(self, batches: list[Events], reset: bool) -> None:
        """Apply batches in order and report the net change (with ``reset``: the whole mirror)."""
        if reset:
            self.mirror.reset()
        applied = self.mirror.apply([event for events in batches for event in events])
        if reset:
            self.on_changes(BlockChanges(stored=set(self.mirror.blocks), reset=True))
        elif applied:
            self.on_changes(applied)

    async def _fetch(self, first: int, count: int | None) -> tuple[list[tuple[int, Events]], str]:
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
        batches: list[tuple[int, Events]] = []
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
                    batches.append((seq, decode_batch(frames[2])))
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
