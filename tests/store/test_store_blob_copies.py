"""Blob copies: which control planes hold each blob."""

from __future__ import annotations

import pytest

from llmgw.errors import NotLeader, ValidationFailed
from llmgw.store import Fence, Store
from llmgw.testing.clock import FakeClock

SHA = "ab" * 32
OTHER = "cd" * 32


async def test_recorded_copies_read_back_oldest_first(store: Store, clock: FakeClock) -> None:
    await store.blob_copies.record(SHA, "cp2", "10.0.0.2:8443")
    await clock.advance(5)
    await store.blob_copies.record(SHA, "cp1", "10.0.0.1:8443")
    copies = await store.blob_copies.of(SHA)
    assert [(c.plane, c.address) for c in copies] == [("cp2", "10.0.0.2:8443"), ("cp1", "10.0.0.1:8443")]
    assert copies[1].copied_at == clock.utcnow()


async def test_recording_a_copy_again_keeps_its_time_and_takes_the_new_address(
    store: Store, clock: FakeClock
) -> None:
    await store.blob_copies.record(SHA, "cp1", "10.0.0.1:8443")
    first = (await store.blob_copies.of(SHA))[0].copied_at
    await clock.advance(5)
    await store.blob_copies.record(SHA, "cp1", "10.0.0.9:8443")
    (copy,) = await store.blob_copies.of(SHA)
    assert (copy.address, copy.copied_at) == ("10.0.0.9:8443", first)


async def test_all_groups_the_copies_by_blob(store: Store) -> None:
    await store.blob_copies.record(SHA, "cp1", "a:1")
    await store.blob_copies.record(OTHER, "cp1", "a:1")
    await store.blob_copies.record(OTHER, "cp2", "b:1")
    grouped = await store.blob_copies.all()
    assert {sha: [c.plane for c in copies] for sha, copies in grouped.items()} == {
        SHA: ["cp1"],
        OTHER: ["cp1", "cp2"],
    }


async def test_a_forgotten_copy_is_no_longer_listed(store: Store) -> None:
    await store.blob_copies.record(SHA, "cp1", "a:1")
    await store.blob_copies.record(SHA, "cp2", "b:1")
    await store.blob_copies.forget(SHA, "cp1")
    assert [c.plane for c in await store.blob_copies.of(SHA)] == ["cp2"]


async def test_a_standby_records_its_own_copies_through_the_fence(store: Store) -> None:
    store.fence = Fence("cp2", None)  # a standby: every fenced write is refused
    with pytest.raises(NotLeader):
        await store.blobs.add(SHA, 10, "model.gguf", "weights")
    await store.blob_copies.record(SHA, "cp2", "b:1")
    assert [c.plane for c in await store.blob_copies.of(SHA)] == ["cp2"]


async def test_a_copy_of_something_not_a_sha256_is_refused(store: Store) -> None:
    with pytest.raises(ValidationFailed, match="sha256"):
        await store.blob_copies.record("model.gguf", "cp1", "a:1")
