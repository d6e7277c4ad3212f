"""The approximate prefix tree: matching by chunks, bounded memory, LRU eviction."""

from __future__ import annotations

import pytest

from llmgw.core.prefixes import PrefixTree


def test_match_counts_leading_chunks_per_replica() -> None:
    tree = PrefixTree(chunk_chars=4)
    tree.insert("aaaabbbbcccc", "r1")
    tree.insert("aaaabbbbdddd", "r2")
    depth, chunks = tree.match("aaaabbbbcccceeee")
    assert chunks == 4
    assert depth == {"r1": 3, "r2": 2}
    assert tree.match("aaaabbbbcccc", replicas={"r2"})[0] == {"r2": 2}
    assert tree.match("zzzzaaaa")[0] == {}
    assert tree.match("aaa") == ({}, 0)  # shorter than a chunk: nothing to match


def test_memory_is_bounded_and_least_recently_used_goes_first() -> None:
    tree = PrefixTree(max_nodes=4, chunk_chars=2)
    tree.insert("aabb", "r1")
    tree.insert("ccdd", "r2")
    tree.insert("aabb", "r1")  # used again: now newer than ccdd
    tree.insert("eeff", "r3")  # two more nodes: ccdd's two go
    assert len(tree) == 4 and tree.evicted == 2
    assert tree.match("ccdd")[0] == {}
    assert tree.match("aabb")[0] == {"r1": 2}
    assert tree.match("eeff")[0] == {"r3": 2}


def test_holders_per_node_are_bounded_newest_kept() -> None:
    tree = PrefixTree(chunk_chars=2, max_holders=2)
    for replica in ("r1", "r2", "r3"):
        tree.insert("aa", replica)
    assert tree.match("aa")[0] == {"r2": 1, "r3": 1}
    tree.forget("r2")
    tree.forget("r3")
    assert len(tree) == 0


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="≥ 1"):
        PrefixTree(max_nodes=0)


def test_roots_count_the_distinct_prefixes_each_replica_was_sent() -> None:
    tree = PrefixTree(max_nodes=3, chunk_chars=2, max_holders=2)
    tree.insert("aabb", "r1")
    tree.insert("aacc", "r1")  # the same beginning: still one root
    assert tree.roots == {"r1": 1}
    tree.insert("ddee", "r2")  # five nodes over three: the oldest two (aa and bb) go
    assert tree.roots == {"r2": 1}
    tree.insert("dd", "r3")
    tree.insert("dd", "r1")  # two holders at most: r2 drops out
    assert tree.roots == {"r3": 1, "r1": 1}
    tree.forget("r3")
    assert tree.roots == {"r1": 1}


def test_a_salt_keys_the_same_text_apart() -> None:
    tree = PrefixTree(max_nodes=100, chunk_chars=4)
    tree.insert("abcdefgh", "r1", salt="kb-a")
    tree.insert("abcdefgh", "r2")
    assert tree.match("abcdefgh", salt="kb-a") == ({"r1": 2}, 2)
    assert tree.match("abcdefgh") == ({"r2": 2}, 2)
    assert tree.match("abcdefgh", salt="kb-b") == ({}, 2)
