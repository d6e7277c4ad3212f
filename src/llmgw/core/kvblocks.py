"""Exact KV-cache overlap: vLLM's block hashes, and an index of which replica holds which block.

vLLM names a full block of ``block_size`` prompt tokens (with
``--prefix-caching-hash-algo sha256_cbor``) as
``sha256(cbor((parent, tuple(tokens), extra_keys)))`` in canonical CBOR,
the first block's parent being ``NONE_HASH = sha256(cbor(PYTHONHASHSEED))``
and ``extra_keys`` None for plain text, except that a request's ``cache_salt``
makes the first block's ``extra_keys`` ``(("cache_salt", salt),)`` (vLLM's
``generate_block_hash_extra_keys`` tags each extra key with its source, and
the salt counts from token 0 only: the blocks after it differ through their
parent). A block's size is the engine's (vLLM's CPU backend uses 128, its GPU
backends 16 unless the model's attention needs another): the agent reads it
from the events, never assumes it. Its KV events carry a hash either as
that 32-byte digest or as the integer of its last eight bytes read big-endian
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``); :func:`block_key` brings both to the
integer, which is what :class:`KvIndex` stores.

:class:`KvIndex` mirrors the events: per block, the replicas holding it.
:meth:`KvIndex.leading` says, per replica, how many of a prompt's leading
blocks it holds, which is how many prompt tokens it would not compute again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

Cbor = bytes | str | int | None | Sequence["Cbor"]


def _head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([major << 5 | value])
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < 1 << (8 * size):
            return bytes([major << 5 | info]) + value.to_bytes(size, "big")
    raise ValueError("integer too large for CBOR (over 64 bits)")


def cbor(value: Cbor) -> bytes:
    """Canonical CBOR of byte and text strings, integers, None, booleans and arrays."""
    if value is None:
        return b"\xf6"
    if isinstance(value, bool):
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        return _head(0, value) if value >= 0 else _head(1, -1 - value)
    if isinstance(value, bytes):
        return _head(2, len(value)) + value
    if isinstance(value, str):
        data = value.encode()
        return _head(3, len(data)) + data
    return _head(4, len(value)) + b"".join(cbor(item) for item in value)


def _uint(value: int) -> bytes:
    if value < 24:
        return bytes((value,))
    if value < 0x100:
        return bytes((0x18, value))
    if value < 0x10000:
        return bytes((0x19, value >> 8, value & 0xFF))
    return _head(0, value)


def block_digest(parent: bytes, tokens: tuple[int, ...]) -> bytes:
    """``sha256_cbor((parent, tokens, None))`` for a 32-byte parent and non-negative tokens, fast."""
    if len(parent) != 32 or min(tokens, default=0) < 0:
        return sha256_cbor((parent, tokens, None))
    encoded = b"".join([b"\x83\x58\x20", parent, _head(4, len(tokens)), *map(_uint, tokens), b"\xf6"])
    return hashlib.sha256(encoded).digest()


def sha256_cbor(value: Cbor) -> bytes:
    return hashlib.sha256(cbor(value)).digest()


def none_hash(seed: str) -> bytes:
    """vLLM's NONE_HASH for the engine's ``PYTHONHASHSEED``."""
    return sha256_cbor(seed)


def salt_keys(salt: str) -> tuple[tuple[str, str]]:
    """The extra keys of a salted request's first block: ``(("cache_salt", salt),)``."""
    return (("cache_salt", salt),)


def block_key(external: bytes | int) -> int:
    """A block hash as an event carries it (digest or integer) → the integer of its last 8 bytes."""
    if isinstance(external, int):
        return external
    return int.from_bytes(external[-8:], "big")


SPAN_BLOCKS = 8
"""Blocks the hasher's memo also keeps together, so a long prefix seen before costs few lookups."""


class BlockHasher:
    """A prompt's block hashes as vLLM computes them, with a bounded memo of blocks seen before.

    Prompts that share a prefix share its blocks, so a request usually hashes
    only its new tail.
    """

    def __init__(self, seed: str, block_size: int = 16, memo_size: int = 200_000) -> None:
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self.root = none_hash(seed)
        self.block_size = block_size
        self.memo_size = memo_size
        self._memo: dict[tuple[bytes, tuple[int, ...]], tuple[bytes, int]] = {}
        self._spans: dict[tuple[bytes, tuple[int, ...]], list[tuple[bytes, int]]] = {}

    def _block(self, parent: bytes, block: tuple[int, ...]) -> tuple[bytes, int]:
        memo = self._memo
        key = (parent, block)
        known = memo.get(key)
        if known is None:
            digest = block_digest(parent, block)
            known = memo[key] = (digest, int.from_bytes(digest[-8:], "big"))
            if len(memo) > self.memo_size:
                del memo[next(iter(memo))]  # the oldest entry
        return known

    def _chain(self, tokens: Sequence[int], salt: str = "") -> list[tuple[bytes, int]]:
        size = self.block_size
        span = size * SPAN_BLOCKS
        spans = self._spans
        parent = self.root
        out: list[tuple[bytes, int]] = []
        start = 0
        if salt:
            if len(tokens) < size:
                return out
            # The salted first block is hashed apart (never memoised under the unsalted key).
            digest = sha256_cbor((parent, tuple(tokens[:size]), salt_keys(salt)))
            out.append((digest, int.from_bytes(digest[-8:], "big")))
            parent = digest
            start = size
        # Whole spans of SPAN_BLOCKS blocks first, one memo lookup each (a long shared prefix
        # costs a few lookups, not one per block); then the blocks left, one by one.
        while start + span <= len(tokens):
            key = (parent, tuple(tokens[start : start + span]))
            known = spans.get(key)
            if known is None:
                known = []
                for offset in range(start, start + span, size):
                    known.append(self._block(parent if not known else known[-1][0],
                                             tuple(tokens[offset : offset + size])))  # fmt: skip
                spans[key] = known
                if len(spans) > self.memo_size // SPAN_BLOCKS:
                    del spans[next(iter(spans))]
            out.extend(known)
            parent = known[-1][0]
            start += span
        for offset in range(start, len(tokens) - size + 1, size):
            known_block = self._block(parent, tuple(tokens[offset : offset + size]))
            out.append(known_block)
            parent = known_block[0]
        return out

    def digests(self, tokens: Sequence[int], salt: str = "") -> list[bytes]:
        """The 32-byte hash of each full block of ``tokens`` (sent with cache ``salt``), in order."""
        return [digest for digest, _ in self._chain(tokens, salt)]

    def keys(self, tokens: Sequence[int], salt: str = "") -> list[int]:
        """The blocks' hashes as :class:`KvIndex` keys them (the last 8 bytes as an integer)."""
        return [key for _, key in self._chain(tokens, salt)]


class KvIndex:
    """Which replica holds which KV block, from the engines' events."""

    def __init__(self) -> None:
        self._holders: dict[int, set[str]] = {}
        self._blocks: dict[str, set[int]] = {}

    def stored(self, replica: str, hashes: Iterable[bytes | int]) -> None:
        mine = self._blocks.setdefault(replica, set())
        for external in hashes:
            key = block_key(external)
            mine.add(key)
            self._holders.setdefault(key, set()).add(replica)

    def removed(self, replica: str, hashes: Iterable[bytes | int]) -> None:
        mine = self._blocks.get(replica)
        if mine is None:
            return
        for external in hashes:
            key = block_key(external)
            mine.discard(key)
            holders = self._holders.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del self._holders[key]

    def clear(self, replica: str) -> None:
        """Forget everything ``replica`` held (its cache was cleared, it restarted, or it left)."""
        mine = self._blocks.pop(replica, set())
        for key in mine:
            holders = self._holders.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del self._holders[key]

    def held(self, replica: str) -> int:
        return len(self._blocks.get(replica, ()))

    def __len__(self) -> int:
        """Blocks known to be held somewhere."""
        return len(self._holders)

    def leading(self, keys: Sequence[int], replicas: Collection[str] | None = None) -> dict[str, int]:
        """Per replica, how many of ``keys``' leading blocks it holds (replicas holding none left out)."""
        counts: dict[str, int] = {}
        if not keys:
            return counts
        first = self._holders.get(keys[0])
        if not first:
            return counts
        alive = set(first) if replicas is None else {r for r in first if r in replicas}
        index = 0
        holders_of = self._holders.get
        while alive:
            index += 1
            for replica in alive:
                counts[replica] = index
            if index == len(keys):
                break
            holders = holders_of(keys[index])
            if not holders:
                break
            if not alive <= holders:
                alive &= holders
        return counts


@dataclass(frozen=True)
class KvBlocksUpdate:
    """What one replica's engine stored and freed in its KV cache, as the agent reports it."""

    model: str
    replica_id: str
    stored: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    reset: bool = False
    """True when the engine's events had a gap: forget every block held for this replica first."""
    hash_seed: str = ""
    """The engine's PYTHONHASHSEED (vLLM's NONE_HASH comes from it)."""
    block_size: int = 0
    """Tokens per block, as the engine's events say; 0 while unknown (it has stored nothing yet)."""
    mismatch: str = ""
    """Why the engine's block hashes disagree with the hashing llmgw does for it (its blocks can
    then never match a prompt); empty while they agree or nothing was checked yet."""
