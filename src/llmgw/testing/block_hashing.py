"""Block hashes as vLLM computes them with ``--prefix-caching-hash-algo sha256_cbor``.

vLLM hashes a full block of ``block_size`` tokens as
``sha256(cbor((parent_hash, tuple(token_ids), extra_keys)))`` in canonical
CBOR, the first block's parent being ``NONE_HASH``: ``sha256(cbor(seed))`` of
the ``PYTHONHASHSEED`` string (random bytes without one, which is why the
agent fixes the seed). ``extra_keys`` is None for plain text (no LoRA,
images or cache salt). KV events publish a hash either as the 32-byte digest
or, with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (on by default), as the
integer of its last eight bytes read big-endian.

The encoder below covers what those tuples hold: byte and text strings,
integers, None and arrays, each in its shortest canonical form.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

Cbor = bytes | str | int | None | Sequence["Cbor"]


def _head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([major << 5 | value])
    for info, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < 1 << (8 * size):
            return bytes([major << 5 | info]) + value.to_bytes(size, "big")
    raise ValueError("integer too large for CBOR")


def cbor(value: Cbor) -> bytes:
    """Canonical CBOR of ``value``."""
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


def sha256_cbor(value: Cbor) -> bytes:
    return hashlib.sha256(cbor(value)).digest()


def none_hash(seed: str | None = None) -> bytes:
    """vLLM's NONE_HASH for ``PYTHONHASHSEED`` (read from the environment when not given)."""
    seed = os.environ.get("PYTHONHASHSEED") if seed is None else seed
    return os.urandom(32) if seed is None else sha256_cbor(seed)


def block_hash(parent: bytes | None, tokens: Sequence[int], root: bytes) -> bytes:
    """One block's hash, chained on its parent's (``root``, NONE_HASH, for the first block)."""
    return sha256_cbor((parent or root, tuple(tokens), None))


def external(digest: bytes, as_int: bool) -> bytes | int:
    """A hash as KV events carry it: the digest, or the integer of its last eight bytes."""
    return int.from_bytes(digest[-8:], "big") if as_int else digest
