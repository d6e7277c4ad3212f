"""vLLM's block hashes (golden values from cbor2 and hashlib) and the KV index's overlap."""

from __future__ import annotations

import hashlib

import cbor2
import pytest

from llmgw.core.kvblocks import BlockHasher, KvIndex, block_digest, block_key, cbor, none_hash


def _golden_chain(tokens: list[int], seed: str, block_size: int) -> list[bytes]:
    parent = hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest()
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tuple(tokens[start : start + block_size])
        parent = hashlib.sha256(cbor2.dumps((parent, block, None), canonical=True)).digest()
        out.append(parent)
    return out


@pytest.mark.parametrize(
    "value",
    [0, 23, 24, 255, 256, 65535, 65536, 2**32, -1, -500, b"", b"x" * 40, "seed", None, [1, [2, b"a"]]],
)
def test_cbor_matches_cbor2(value: object) -> None:
    assert cbor(value) == cbor2.dumps(value, canonical=True)  # type: ignore[arg-type]


def test_block_hashes_match_vllms_sha256_cbor() -> None:
    tokens = [(i * 7919) % 32000 for i in range(70)]
    hasher = BlockHasher("0", block_size=16)
    golden = _golden_chain(tokens, "0", 16)
    assert len(golden) == 4  # the 6 tokens past the last full block are not hashed
    assert hasher.digests(tokens) == golden
    assert hasher.root == hashlib.sha256(cbor2.dumps("0", canonical=True)).digest() == none_hash("0")
    # The memo answers the same again, and a prompt sharing the first two blocks shares their hashes.
    assert hasher.digests(tokens) == golden
    other = tokens[:32] + [1] * 16
    assert hasher.digests(other)[:2] == golden[:2]
    assert hasher.digests(other)[2] != golden[2]
    assert hasher.keys(tokens) == [int.from_bytes(d[-8:], "big") for d in golden]


def test_block_key_takes_either_encoding() -> None:
    digest = bytes(range(32))
    assert block_key(digest) == int.from_bytes(digest[-8:], "big") == block_key(block_key(digest))


def test_leading_counts_only_the_unbroken_start() -> None:
    index = KvIndex()
    index.stored("a", [1, 2, 3])
    index.stored("b", [1, 3])
    index.stored("c", [2, 3])
    assert index.leading([1, 2, 3, 4]) == {"a": 3, "b": 1}
    assert index.leading([1, 2, 3], replicas={"b"}) == {"b": 1}
    assert index.leading([9, 1]) == {}
    assert index.leading([]) == {}
    index.removed("a", [2])
    assert index.leading([1, 2, 3]) == {"a": 1, "b": 1}
    assert len(index) == 3 and index.held("a") == 2


def test_clear_forgets_one_replica_only() -> None:
    index = KvIndex()
    index.stored("a", [1, 2])
    index.stored("b", [1, bytes(24) + (2).to_bytes(8, "big")])
    index.clear("a")
    assert index.held("a") == 0
    assert index.leading([1, 2]) == {"b": 2}
    index.clear("b")
    assert len(index) == 0


@pytest.mark.parametrize("tokens", [(0, 23, 24, 255, 256, 65535, 65536, 2**40), (), tuple(range(30))])
def test_the_fast_block_encoding_is_canonical_cbor(tokens: tuple[int, ...]) -> None:
    parent = bytes(range(32))
    expected = hashlib.sha256(cbor2.dumps((parent, tokens, None), canonical=True)).digest()
    assert block_digest(parent, tokens) == expected


def test_long_prompts_hash_alike_through_the_span_memo() -> None:
    tokens = [(i * 104729) % 32000 for i in range(16 * 8 * 2 + 40)]  # two whole spans and a tail
    hasher = BlockHasher("7", block_size=16)
    golden = _golden_chain(tokens, "7", 16)
    assert hasher.digests(tokens) == golden
    assert hasher.digests(tokens) == golden  # from the memo
    changed = tokens[:200] + [1] * 100  # the second span differs: its blocks are hashed again
    assert hasher.digests(changed) == _golden_chain(changed, "7", 16)


def test_a_cache_salt_enters_the_first_block_as_vllms_extra_keys() -> None:
    """vLLM 0.32: ``extra_keys = (("cache_salt", salt),)`` for the block starting at token 0, None
    after it (each extra key tagged with its source; the recorded engine's events agree:
    tests/engines/test_vllm_recordings.py)."""
    tokens = [(i * 7919) % 32000 for i in range(300)]  # past a whole memo span
    salt = "kb-0123456789abcdef0123456789abcdef"
    root = none_hash("0")
    first = hashlib.sha256(cbor2.dumps([root, tokens[:16], [["cache_salt", salt]]], canonical=True)).digest()
    golden = [first]
    for start in range(16, 288, 16):
        block = [golden[-1], tokens[start : start + 16], None]
        golden.append(hashlib.sha256(cbor2.dumps(block, canonical=True)).digest())
    hasher = BlockHasher("0", block_size=16)
    plain = hasher.digests(tokens)
    assert hasher.digests(tokens, salt) == golden
    assert hasher.digests(tokens) == plain  # the salted chain left the plain memo alone
    assert not set(plain) & set(golden)
    assert hasher.digests(tokens[:15], salt) == []
