"""Block hashes as vLLM computes them with ``--prefix-caching-hash-algo sha256_cbor``.

vLLM hashes a full block of ``block_size`` tokens as
``sha256(cbor((parent_hash, tuple(token_ids), extra_keys)))`` in canonical
CBOR, the first block's parent being ``NONE_HASH``: ``sha256(cbor(seed))`` of
the ``PYTHONHASHSEED`` string (random bytes without one, which is why the
agent fixes the seed). ``extra_keys`` is None for plain text (no LoRA,
images or cache salt; a request's ``cache_salt`` makes the first block's
``(("cache_salt", salt),)``, each extra key tagged with its source as vLLM
0.32 does). KV events publish a hash either as the 32-byte digest
or, with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (on by default), as the
integer of its last eight bytes read big-endian.

The CBOR encoder is core's (:func:`llmgw.core.kvblocks.cbor`, checked against
cbor2); this stand-in's independence from core lies in its chaining: it
builds each block's tuple and hashes it the plain way, never through
:class:`~llmgw.core.kvblocks.BlockHasher`'s memo or fast path.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

from llmgw.core.kvblocks import Cbor, cbor

__all__ = ["Cbor", "block_hash", "cbor", "external", "none_hash", "sha256_cbor"]


def sha256_cbor(value: Cbor) -> bytes:
    return hashlib.sha256(cbor(value)).digest()


def none_hash(seed: str | None = None) -> bytes:
    """vLLM's NONE_HASH for ``PYTHONHASHSEED`` (read from the environment when not given)."""
    seed = os.environ.get("PYTHONHASHSEED") if seed is None else seed
    return os.urandom(32) if seed is None else sha256_cbor(seed)


def block_hash(parent: bytes | None, tokens: Sequence[int], root: bytes, extra_keys: Cbor = None) -> bytes:
    """One block's hash, chained on its parent's (``root``, NONE_HASH, for the first block);
    ``extra_keys``: ``(("cache_salt", salt),)`` for the first block of a salted request."""
    return sha256_cbor((parent or root, tuple(tokens), extra_keys))


def external(digest: bytes, as_int: bool) -> bytes | int:
    """A hash as KV events carry it: the digest, or the integer of its last eight bytes."""
    return int.from_bytes(digest[-8:], "big") if as_int else digest
