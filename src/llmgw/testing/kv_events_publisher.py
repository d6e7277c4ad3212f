"""vLLM's KV-cache events from a stand-in: a ZMQ PUB socket sending msgpack batches, a ROUTER replaying them.

As vLLM's ``ZmqEventPublisher``:

- The PUB socket binds the configured endpoint when it has a wildcard
  (``tcp://*:5557``, ``::``) or is ``ipc://``/``inproc://``, and otherwise
  connects to it (vLLM's "bind stable, connect volatile" rule: with
  ``tcp://127.0.0.1:PORT`` the subscriber listens and the engine connects).
- Each batch goes as three frames ``[topic, sequence (8 bytes, big
  endian), payload]``, sequence numbers counting from 0. The payload is
  vLLM's msgspec ``KVEventBatch``, encoded array-like: ``[ts, events,
  data_parallel_rank]``, each event a map tagged by ``type`` (vLLM 0.32,
  as recorded in ``tests/engines/data/vllm-0.32.0-cpu-kv-events.json``):
  ``BlockStored`` with ``block_hashes``, ``parent_block_hash``,
  ``token_ids``, ``block_size``, ``lora_id``, ``medium``, ``lora_name``,
  ``extra_keys`` (one entry per block: ``[cache_salt]`` for a salted
  request's first block, else None), ``group_idx`` and
  ``kv_cache_spec_kind``; ``BlockRemoved`` with ``block_hashes``,
  ``medium`` and ``group_idx``; ``AllBlocksCleared``.
- With ``replay_endpoint`` the last ``buffer_steps`` batches (10 000 by
  default) are kept and a ROUTER socket binds there. A client (DEALER) sends
  ``[b"", start_seq (8 bytes big-endian)]``; it is answered, for every kept
  batch with ``seq >= start_seq``, ``[b"", seq, payload]``, then the end
  marker ``[b"", END_SEQ, b""]`` with ``END_SEQ`` = -1 as 8 signed bytes. A
  request of any other shape is ignored with a warning.

Hashes go in either of vLLM's two encodings: integers of the digest's last
eight bytes (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, vLLM's default) or
the 32-byte digests (``=0``).

For tests, :meth:`KvEventsPublisher.lose` (or ``LLMGW_STANDIN_KV_LOSE``, a
comma-separated list of sequence numbers, in the stand-in's environment)
makes the PUB side skip batches while still keeping them for replay: the
gaps a congested or reconnecting subscriber sees, produced for real.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any

import msgpack
import zmq

from llmgw.testing.block_hashing import external
from llmgw.testing.engine_standin import Standin

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay's end marker, as vLLM sends it."""
BUFFER_STEPS = 10_000
"""vLLM's default ``buffer_steps``: batches kept for replay."""
LOSE_ENV = "LLMGW_STANDIN_KV_LOSE"
"""Sequence numbers (comma-separated) the stand-in does not publish, keeping them for replay."""
_POLL_MS = 50


def _binds(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard, IPv6 or local endpoint, connect to any other."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KvEventsPublisher:
    def __init__(
        self,
        endpoint: str,
        topic: str,
        int_hashes: bool = True,
        block_size: int = 16,
        replay_endpoint: str | None = None,
        buffer_steps: int = BUFFER_STEPS,
    ) -> None:
        self.int_hashes = int_hashes
        self.topic = topic.encode()
        self.block_size = block_size
        self.sequence = 0
        self.lost: set[int] = set()
        """Sequence numbers not to publish (kept for replay all the same)."""
        self.replays = 0
        """Replay requests of the right shape received."""
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        if _binds(endpoint):
            self._socket.bind(endpoint.replace("tcp://*", "tcp://0.0.0.0"))
        else:
            self._socket.connect(endpoint)
        self._running = True
        self._replayer: threading.Thread | None = None
        if replay_endpoint:
            router = self._context.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(replay_endpoint.replace("tcp://*", "tcp://0.0.0.0"))
            self._replayer = threading.Thread(target=self._serve_replays, args=(router,), daemon=True)
            self._replayer.start()

    def lose(self, *sequences: int) -> None:
        """Do not publish these sequence numbers (a test's lost messages); replay still has them."""
        self.lost.update(sequences)

    def _hashes(self, hashes: list[bytes]) -> list[bytes | int]:
        return [external(digest, self.int_hashes) for digest in hashes]

    def stored(self, hashes: list[bytes], parent: bytes | None, tokens: list[int], salt: str = "") -> None:
        """Blocks stored; ``salt``: the first of them is a salted request's first block."""
        parent_hash = None if parent is None else external(parent, self.int_hashes)
        extra: list[list[str] | None] = [None] * len(hashes)
        if salt and hashes:
            extra[0] = [salt]
        self.send([{
            "type": "BlockStored", "block_hashes": self._hashes(hashes), "parent_block_hash": parent_hash,
            "token_ids": tokens, "block_size": self.block_size, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": extra, "group_idx": 0, "kv_cache_spec_kind": "full_attention",
        }])  # fmt: skip

    def removed(self, hashes: list[bytes]) -> None:
        self.send(
            [{"type": "BlockRemoved", "block_hashes": self._hashes(hashes), "medium": "GPU", "group_idx": 0}]
        )

    def cleared(self) -> None:
        self.send([{"type": "AllBlocksCleared"}])

    def send(self, events: list[Any]) -> None:
        batch = [time.time(), events, 0]
        payload = msgpack.packb(batch, use_bin_type=True)
        sequence = self.sequence
        self.sequence += 1
        with self._lock:
            self._buffer.append((sequence, payload))
        if sequence in self.lost:
            return
        try:
            self._socket.send_multipart([self.topic, sequence.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # no subscriber keeping up: PUB drops, as vLLM's does

    def _serve_replays(self, router: zmq.Socket[bytes]) -> None:
        """The replay socket's own thread (a ZMQ socket stays on one thread)."""
        try:
            while self._running:
                if router.poll(_POLL_MS):
                    self._answer(router, router.recv_multipart())
        finally:
            router.close(0)

    def _answer(self, router: zmq.Socket[bytes], frames: list[bytes]) -> None:
        if len(frames) != 3:
            log.warning("Invalid replay request: %s", frames)
            return
        client, _, start = frames
        self.replays += 1  # before answering: a client that has its answer sees it counted
        first = int.from_bytes(start, "big")
        with self._lock:
            kept = [(seq, payload) for seq, payload in self._buffer if seq >= first]
        for seq, payload in kept:
            router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
        router.send_multipart([client, b"", END_SEQ, b""])

    def close(self) -> None:
        self._running = False
        if self._replayer is not None:
            self._replayer.join()
        self._socket.close(0)


def _lost_from_env() -> set[int]:
    text = os.environ.get(LOSE_ENV, "")
    return {int(part) for part in text.split(",") if part.strip()}


def attach(standin: Standin, config: dict[str, Any]) -> KvEventsPublisher:
    """Publish ``standin``'s block cache changes as vLLM's ``--kv-events-config`` asks."""
    publisher = KvEventsPublisher(
        str(config.get("endpoint") or "tcp://*:5557"),
        str(config.get("topic") or ""),
        os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1") != "0",
        standin.settings.block_size,
        replay_endpoint=config.get("replay_endpoint") or None,
        buffer_steps=int(config.get("buffer_steps", BUFFER_STEPS)),
    )
    publisher.lose(*_lost_from_env())
    standin.cache.on_stored = publisher.stored
    standin.cache.on_removed = publisher.removed
    return publisher
