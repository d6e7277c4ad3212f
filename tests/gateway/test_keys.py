"""The key ring: keys checked by the hash of their secret, in memory."""

from __future__ import annotations

import hashlib

from llmgw.gateway import KeyEntry, KeyRing, hash_secret


def entry(key_id: str, secret: str) -> KeyEntry:
    return KeyEntry(key_id, f"name-{key_id}", hash_secret(secret), owner="team:a")


def test_the_hash_is_the_sha256_hex_of_the_whole_secret() -> None:
    assert hash_secret("sk-abc") == hashlib.sha256(b"sk-abc").hexdigest()


def test_a_known_secret_finds_its_key_and_an_unknown_one_nothing() -> None:
    ring = KeyRing([entry("k1", "sk-one"), entry("k2", "sk-two")])
    found = ring.lookup("sk-two")
    assert found is not None and found.key_id == "k2"
    assert ring.lookup(b"sk-one") == ring.get("k1")
    assert ring.lookup("sk-three") is None
    assert ring.lookup("") is None


def test_the_ring_keeps_no_secret_in_clear() -> None:
    ring = KeyRing([entry("k1", "sk-one")])
    assert "sk-one" not in repr(vars(ring))


def test_replace_makes_the_given_keys_the_only_ones() -> None:
    ring = KeyRing([entry("k1", "sk-one")])
    ring.replace([entry("k2", "sk-two")])
    assert ring.lookup("sk-one") is None
    assert ring.lookup("sk-two") is not None
    assert len(ring) == 1


def test_add_replaces_a_key_with_the_same_id_and_remove_forgets_it() -> None:
    ring = KeyRing([entry("k1", "sk-old")])
    ring.add(entry("k1", "sk-new"))
    assert ring.lookup("sk-old") is None
    assert ring.lookup("sk-new") is not None
    assert ring.remove("k1") is True
    assert ring.lookup("sk-new") is None
    assert ring.remove("k1") is False


def test_an_upper_case_hash_is_accepted() -> None:
    ring = KeyRing([KeyEntry("k1", "n", hash_secret("sk-one").upper())])
    assert ring.lookup("sk-one") is not None
