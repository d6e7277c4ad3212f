"""vLLM's KV-cache events from a stand-in: a ZMQ PUB socket sending msgpack batches.

As vLLM's ``ZmqEventPublisher``: the publisher binds the configured endpoint
and sends each batch as three frames ``[topic, sequence (8 bytes, big
endian), payload]``. The payload is a ``KVEventBatch`` ``[ts, events,
data_parallel_rank]`` whose events are ``BlockStored`` (block hashes, parent
hash, token ids, block size, LoRA id, medium), ``BlockRemoved`` (hashes,
medium) and ``AllBlocksCleared``, in one of the two wire encodings vLLM's
msgspec structs take:

- ``array`` (``array_like`` and tagged): each event ``["BlockStored", …fields]``;
- ``map``: each event ``{"type": "BlockStored", "block_hashes": …}``.

``LLMGW_STANDIN_KV_ENCODING`` picks one (``array`` by default). Block hashes
here are the stand-in cache's own sha256 chain, sent as bytes.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgpack
import zmq

from llmgw.testing.engine_standin import Standin

ENCODINGS = ("array", "map")


class KvEventsPublisher:
    def __init__(self, endpoint: str, topic: str, encoding: str = "array", block_size: int = 16) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"unknown KV events encoding {encoding!r}; use one of {ENCODINGS}")
        self.encoding = encoding
        self.topic = topic.encode()
        self.block_size = block_size
        self.sequence = 0
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint.replace("tcp://*", "tcp://0.0.0.0"))

    def _event(self, kind: str, fields: dict[str, Any]) -> Any:
        if self.encoding == "map":
            return {"type": kind, **fields}
        return [kind, *fields.values()]

    def stored(self, hashes: list[bytes], parent: bytes | None, tokens: list[int]) -> None:
        fields = {"block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                  "block_size": self.block_size, "lora_id": None, "medium": "GPU"}  # fmt: skip
        self.send([self._event("BlockStored", fields)])

    def removed(self, hashes: list[bytes]) -> None:
        self.send([self._event("BlockRemoved", {"block_hashes": hashes, "medium": "GPU"})])

    def cleared(self) -> None:
        self.send([self._event("AllBlocksCleared", {})])

    def send(self, events: list[Any]) -> None:
        batch: Any = [time.time(), events, None]
        if self.encoding == "map":
            batch = {"ts": time.time(), "events": events, "data_parallel_rank": None}
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
        os.environ.get("LLMGW_STANDIN_KV_ENCODING", "array"),
        standin.settings.block_size,
    )
    standin.cache.on_stored = publisher.stored
    standin.cache.on_removed = publisher.removed
    return publisher
