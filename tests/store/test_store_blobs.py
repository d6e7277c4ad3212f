"""Blobs: the mirror's files by sha256."""

from __future__ import annotations

import pytest

from llmgw.errors import NotFound, ValidationFailed
from llmgw.store import Store
from llmgw.testing.clock import FakeClock

SHA = "ab" * 32


async def test_an_added_blob_reads_back(store: Store, clock: FakeClock) -> None:
    added = await store.blobs.add(SHA, 94_000_000_000, "model.gguf", "weights")
    assert await store.blobs.get(SHA) == added
    assert (added.size, added.filename, added.kind, added.created_at) == (
        94_000_000_000,
        "model.gguf",
        "weights",
        clock.utcnow(),
    )


async def test_adding_a_known_blob_again_keeps_the_first_record(store: Store, clock: FakeClock) -> None:
    first = await store.blobs.add(SHA, 10, "model.gguf", "weights")
    await clock.advance(5)
    assert await store.blobs.add(SHA, 10, "other.gguf", "weights") == first
    assert await store.blobs.list() == [first]


async def test_a_sha256_is_read_in_any_case_and_with_its_prefix(store: Store) -> None:
    await store.blobs.add("sha256:" + SHA.upper(), 10, "model.gguf", "weights")
    assert (await store.blobs.get(SHA)).sha256 == SHA


async def test_an_unknown_kind_is_refused(store: Store) -> None:
    with pytest.raises(ValidationFailed, match="kind"):
        await store.blobs.add(SHA, 10, "model.gguf", "movie")


async def test_an_unknown_blob_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.blobs.get(SHA)


async def test_a_removed_blob_is_gone(store: Store) -> None:
    await store.blobs.add(SHA, 10, "llama-server.tar.gz", "build")
    await store.blobs.remove(SHA)
    assert await store.blobs.list() == []
