"""Collections, documents and passages as the store keeps them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llmgw.core.tenancy import Owner
from llmgw.errors import Conflict, NotFound
from llmgw.store import Store
from llmgw.store.knowledge import DocumentRecord, NewPassage

TEAM = Owner.parse("team:acme/ml")
WHEN = datetime(2026, 11, 30, tzinfo=UTC)


def _document(name: str, passages: int) -> DocumentRecord:
    return DocumentRecord(name, "text", 10, "0" * 64, passages, "alice", WHEN)


def _passages(count: int) -> list[NewPassage]:
    return [NewPassage(i, f"passage {i}", i * 10, i * 10 + 9, bytes(8)) for i in range(count)]


async def test_a_collection_is_created_listed_with_its_counts_and_deleted(store: Store) -> None:
    created = await store.knowledge.create("handbook", TEAM, "minilm", "alice")
    assert (created.owner, created.embedding_model, created.revision) == (TEAM, "minilm", 0)
    await store.knowledge.add_document("handbook", _document("a.txt", 2), _passages(2))
    await store.knowledge.add_document("handbook", _document("b.txt", 3), _passages(3))
    listed = await store.knowledge.get("handbook")
    assert (listed.documents, listed.passages, listed.revision) == (2, 5, 2)
    await store.knowledge.delete("handbook")
    with pytest.raises(NotFound, match="collection 'handbook' does not exist"):
        await store.knowledge.get("handbook")
    assert await store.knowledge.list() == []


async def test_a_second_collection_of_one_name_is_a_conflict(store: Store) -> None:
    await store.knowledge.create("handbook", TEAM, "minilm", "alice")
    with pytest.raises(Conflict, match="exists already"):
        await store.knowledge.create("handbook", TEAM, "minilm", "bob")


async def test_a_document_uploaded_again_replaces_its_passages(store: Store) -> None:
    record = await store.knowledge.create("handbook", TEAM, "minilm", "alice")
    await store.knowledge.add_document("handbook", _document("a.txt", 3), _passages(3))
    await store.knowledge.add_document("handbook", _document("a.txt", 1), _passages(1))
    assert [p.position for p in await store.knowledge.passages(record.id)] == [0]
    assert [d.passages for d in await store.knowledge.documents("handbook")] == [1]


async def test_a_removed_document_takes_its_passages_and_keywords_with_it(store: Store) -> None:
    record = await store.knowledge.create("handbook", TEAM, "minilm", "alice")
    await store.knowledge.add_document("handbook", _document("a.txt", 2), _passages(2))
    await store.knowledge.remove_document("handbook", "a.txt")
    assert await store.knowledge.passages(record.id) == []
    if store.knowledge.full_text:
        assert await store.knowledge.keyword(record.id, "passage", 10) == []
    with pytest.raises(NotFound, match=r"holds no document 'a\.txt'"):
        await store.knowledge.remove_document("handbook", "a.txt")


async def test_a_document_that_fails_to_store_leaves_nothing(store: Store) -> None:
    record = await store.knowledge.create("handbook", TEAM, "minilm", "alice")
    broken = [*_passages(2), NewPassage(2, None, 0, 0, bytes(8))]  # type: ignore[arg-type]
    with pytest.raises(Exception):  # noqa: B017 - the driver's refusal, translated by the store
        await store.knowledge.add_document("handbook", _document("a.txt", 3), broken)
    assert await store.knowledge.documents("handbook") == []
    assert await store.knowledge.passages(record.id) == []


async def test_sqlite_finds_passages_by_keyword_with_fts5(store: Store) -> None:
    if not store.knowledge.full_text:
        pytest.skip("PostgreSQL searches keywords in memory")
    record = await store.knowledge.create("handbook", TEAM, "minilm", "alice")
    passages = [
        NewPassage(0, "the reactor cools with water", 0, 10, bytes(8)),
        NewPassage(1, "bread rises with yeast", 10, 20, bytes(8)),
    ]
    await store.knowledge.add_document("handbook", _document("a.txt", 2), passages)
    found = await store.knowledge.keyword(record.id, 'yeast" OR (', 10)
    assert len(found) == 1
    ids = [p.id for p in await store.knowledge.passages(record.id)]
    assert found[0][0] == ids[1]


async def test_pairs_are_added_and_read_in_order(store: Store) -> None:
    await store.knowledge.create("handbook", TEAM, "minilm", "alice")
    assert await store.knowledge.set_pairs("handbook", [("q1", "a1"), ("q2", "a2")]) == 2
    record, pairs = await store.knowledge.pairs("handbook")
    assert (record.owner, pairs) == (TEAM, [("q1", "a1"), ("q2", "a2")])


async def test_the_service_key_is_written_once_and_revived_when_revoked(store: Store) -> None:
    assert await store.knowledge.ensure_service_key("llmgw-knowledge", "sk-llmgw-secret")
    assert not await store.knowledge.ensure_service_key("llmgw-knowledge", "sk-llmgw-secret")
    await store.keys.revoke("llmgw-knowledge")
    assert await store.knowledge.ensure_service_key("llmgw-knowledge", "sk-llmgw-secret")
    assert [k.name for k in await store.keys.active()] == ["llmgw-knowledge"]
