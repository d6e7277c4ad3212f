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
changes; :class:`KvEventsFollower` reads the socket and resets the mirror
when a sequence number is skipped (a message lost: what it said is unknown).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from llmgw.core.kvblocks import block_key

log = logging.getLogger(__name__)


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
    """Follows one engine's KV-events socket, mirroring its blocks and reporting net changes."""

    def __init__(self, endpoint: str, on_changes: Callable[[BlockChanges], None], topic: str = "") -> None:
        self.endpoint = endpoint
        self.topic = topic
        self.on_changes = on_changes
        self.mirror = BlockMirror()
        self.sequence: int | None = None
        self.gaps = 0
        """Sequence gaps seen (each reset the mirror)."""

    def receive(self, frames: list[bytes]) -> None:
        """Handle one ``[topic, sequence, payload]`` message."""
        if len(frames) != 3 or len(frames[1]) != 8:
            log.warning("KV events from %s: a message of %d frames ignored", self.endpoint, len(frames))
            return
        sequence = int.from_bytes(frames[1], "big")
        changes = BlockChanges()
        if self.sequence is not None and sequence != self.sequence + 1:
            self.gaps += 1
            changes = self.mirror.reset()
        self.sequence = sequence
        try:
            events = decode_batch(frames[2])
        except ValueError as error:
            log.warning("KV events from %s: %s; the mirror is reset", self.endpoint, error)
            self.on_changes(self.mirror.reset())
            return
        applied = self.mirror.apply(events)
        if changes.reset:
            applied = BlockChanges(stored=set(self.mirror.blocks), reset=True)
        if applied:
            self.on_changes(applied)

    async def run(self) -> None:
        """Subscribe and follow until cancelled."""
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        socket.connect(self.endpoint)
        try:
            while True:
                self.receive(await socket.recv_multipart())
        except asyncio.CancelledError:
            raise
        finally:
            socket.close(0)
