"""Client files in the store: owned by a place, listed in order, expiring, and their blobs released."""

from __future__ import annotations

from llmgw.store import Store
from llmgw.testing.clock import FakeClock

SHA = "a" * 64
OTHER = "b" * 64


async def _file(
    store: Store, owner: str = "project:acme/ml/chat", sha: str = SHA, expires_s: float | None = None
):
    return await store.files.add(
        owner=owner,
        key_id="k1",
        purpose="batch",
        filename="in.jsonl",
        size=12,
        sha256=sha,
        expires_s=expires_s,
    )


async def test_a_file_is_read_by_its_owner_only(store: Store) -> None:
    made = await _file(store)
    assert made.id.startswith("file-") and len(made.id) == 29
    assert await store.files.get("project:acme/ml/chat", made.id) == made
    assert await store.files.get("project:globex/r/x", made.id) is None
    shown = made.as_openai()
    assert shown["object"] == "file" and shown["bytes"] == 12 and shown["purpose"] == "batch"
    assert shown["expires_at"] is None and shown["status"] == "processed"


async def test_files_list_newest_first_by_default_and_page_on(store: Store, clock: FakeClock) -> None:
    made = []
    for _ in range(5):
        made.append(await _file(store))
        await clock.advance(1)
    await _file(store, owner="project:globex/r/x")
    page = await store.files.list("project:acme/ml/chat", limit=2)
    assert page is not None
    files, more = page
    assert [f.id for f in files] == [made[4].id, made[3].id] and more
    page = await store.files.list("project:acme/ml/chat", after=files[-1].id, limit=10)
    assert page is not None and [f.id for f in page[0]] == [m.id for m in reversed(made[:3])] and not page[1]
    oldest = await store.files.list("project:acme/ml/chat", limit=2, newest_first=False)
    assert oldest is not None and [f.id for f in oldest[0]] == [made[0].id, made[1].id]
    assert await store.files.list("project:acme/ml/chat", purpose="user_data") == ([], False)
    assert await store.files.list("project:globex/r/x", after=made[0].id) is None


async def test_an_expired_file_is_gone_before_and_after_the_sweep(store: Store, clock: FakeClock) -> None:
    made = await _file(store, expires_s=60)
    kept = await _file(store, sha=OTHER)
    await clock.advance(61)
    assert await store.files.get("project:acme/ml/chat", made.id) is None
    page = await store.files.list("project:acme/ml/chat")
    assert page is not None and [f.id for f in page[0]] == [kept.id]
    assert [f.id for f in await store.files.expired()] == [made.id]
    assert await store.files.expired() == []


async def test_delete_answers_the_file_once_and_only_to_its_owner(store: Store) -> None:
    made = await _file(store)
    assert await store.files.delete("project:globex/r/x", made.id) is None
    assert await store.files.delete("project:acme/ml/chat", made.id) == made
    assert await store.files.delete("project:acme/ml/chat", made.id) is None


async def test_a_blob_is_released_once_no_file_names_it(store: Store) -> None:
    await store.blobs.add(SHA, 12, "in.jsonl", "file")
    first = await _file(store)
    second = await _file(store)
    assert not await store.files.release(SHA)  # both name it
    await store.files.delete("project:acme/ml/chat", first.id)
    assert not await store.files.release(SHA)
    await store.files.delete("project:acme/ml/chat", second.id)
    assert await store.files.release(SHA)
    assert [b.sha256 for b in await store.blobs.list()] == []


async def test_weights_are_never_released_as_a_file(store: Store) -> None:
    await store.blobs.add(SHA, 12, "model.gguf", "weights")
    assert not await store.files.release(SHA)
    assert [b.sha256 for b in await store.blobs.list()] == [SHA]
