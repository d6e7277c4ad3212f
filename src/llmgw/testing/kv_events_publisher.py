"""vLLM's KV-cache events from a stand-in: a ZMQ PUB socket sending msgpack batches.

As vLLM's ``ZmqEventPublisher``: the publisher binds the configured endpoint
and sends each batch as three frames ``[topic, sequence (8 bytes, big
endian), payload]``. The payload is vLLM's msgspec ``KVEventBatch``, encoded
array-like: ``[ts, events]`` (the data-parallel rank left out while None),
each event tagged: ``["BlockStored", block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium]``, ``["BlockRemoved", block_hashes,
medium]``, ``["AllBlocksCleared"]``.

Hashes go in either of vLLM's two encodings: integers of the digest's last
eight bytes (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, vLLM's default) or
the 32-byte digests (``=0``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgpack
import zmq

from llmgw.testing.block_hashing import external
from llmgw.testing.engine_standin import Standin


class KvEventsPublisher:
    def __init__(self, endpoint: str, topic: str, int_hashes: bool = True, block_size: int = 16) -> None:
        self.int_hashes = int_hashes
        self.topic = topic.encode()
        self.block_size = block_size
        self.sequence = 0
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint.replace("tcp://*", "tcp://0.0.0.0"))

    def _hashes(self, hashes: list[bytes]) -> list[bytes | int]:
        return [external(digest, self.int_hashes) for digest in hashes]

    def stored(self, hashes: list[bytes], parent: bytes | None, tokens: list[int]) -> None:
        parent_hash = None if parent is None else external(parent, self.int_hashes)
        self.send([["BlockStored", self._hashes(hashes), parent_hash, tokens, self.block_size, None, "GPU"]])

    def removed(self, hashes: list[bytes]) -> None:
        self.send([["BlockRemoved", self._hashes(hashes), "GPU"]])

    def cleared(self) -> None:
        self.send([["AllBlocksCleared"]])

    def send(self, events: list[Any]) -> None:
        batch = [time.time(), events]
        payload = msgpack.packb(batch, use_bin_type=True)
        frames = [self.topic, self.sequence.to_bytes(8, "big"), payload]
        self.sequence += 1
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # no subscriber keeping up: PUB drops, as vLLM's does

    def close(self) -> None:
        self._socket.close(0)


def attach(standin: Standin, config: dict[str, Any]) -> KvEventsPublisher:
    """Publish ``standin``'s block cache changes as vLLM's ``--kv-events-config`` asks."""
    publisher = KvEventsPublisher(
        str(config.get("endpoint") or "tcp://*:5557"),
        str(config.get("topic") or ""),
        os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0",
        standin.settings.block_size,
    )
    standin.cache.on_stored = publisher.stored
    standin.cache.on_removed = publisher.removed
    return publisher
