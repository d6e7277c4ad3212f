"""Search as the gateway asks it: collections a key's place may read, hybrid ranking, fresh indexes."""

from __future__ import annotations

import asyncio
import math

import pytest

from llmgw.core.knowledge import UnknownCollection
from llmgw.core.tenancy import Owner, OwnerKind, Place
from llmgw.errors import NotFound
from llmgw.knowledge.indexes import Bm25, fuse
from llmgw.knowledge.searching import KnowledgeIndex, Mode
from llmgw.knowledge.service import Knowledge, knowledge_with, own_url
from llmgw.store.knowledge import CollectionRecord, KnowledgeStore, StoredPassage
from llmgw.testing.eventually import eventually
from llmgw.testing.hashed_embeddings import HashedEmbedder

ML = Owner.parse("team:acme/ml")
WEB = Owner.parse("team:acme/web")
ML_KEY = Place(Owner(OwnerKind.PROJECT, "acme/ml/chat"))

DOCS = {
    "cooling.md": b"# Cooling\n\nThe reactor is cooled by heavy water pumped through the core.",
    "baking.md": b"# Baking\n\nBread rises because yeast turns sugar into carbon dioxide.",
    "sailing.md": b"# Sailing\n\nA sloop carries one mast and a single headsail.",
}


async def _collection(knowledge: Knowledge, name: str, owner: Owner, docs: dict[str, bytes]) -> None:
    record = await knowledge.store.knowledge.create(name, owner, "minilm", "alice")
    for doc, data in docs.items():
        await knowledge.ingesting.store(record, knowledge.ingesting.prepare(doc, data), "alice")


@pytest.mark.parametrize("mode", list(Mode))
async def test_each_mode_finds_the_passage_that_answers(knowledge: Knowledge, mode: Mode) -> None:
    await _collection(knowledge, "guide", ML, DOCS)
    records = await knowledge.index.readable(["guide"], lambda owner: True)
    found = await knowledge.index.search_in(records, "why does bread rise? yeast", 3, mode)
    assert found[0].document == "baking.md" and found[0].collection == "guide"
    assert "yeast" in found[0].text


async def test_a_key_searches_its_teams_and_public_collections_together(knowledge: Knowledge) -> None:
    await _collection(knowledge, "ml", ML, {"cooling.md": DOCS["cooling.md"]})
    await _collection(knowledge, "public", Owner(), {"sailing.md": DOCS["sailing.md"]})
    found = await knowledge.index.search(ML_KEY, ["ml", "public"], "heavy water reactor", 5)
    assert {p.collection for p in found} == {"ml", "public"}
    assert found[0].collection == "ml"


async def test_another_teams_collection_or_a_missing_one_is_unknown(knowledge: Knowledge) -> None:
    await _collection(knowledge, "web", WEB, {"baking.md": DOCS["baking.md"]})
    for names in (["web"], ["nope"]):
        with pytest.raises(UnknownCollection, match=f"collection '{names[0]}' does not exist"):
            await knowledge.index.search(ML_KEY, names, "bread", 5)


async def test_a_document_added_later_is_found_by_the_next_search(knowledge: Knowledge) -> None:
    await _collection(knowledge, "guide", ML, {"cooling.md": DOCS["cooling.md"]})
    assert (await knowledge.index.search(ML_KEY, ["guide"], "sloop mast", 1))[0].document == "cooling.md"
    record = await knowledge.store.knowledge.get("guide")
    await knowledge.ingesting.store(
        record, knowledge.ingesting.prepare("sailing.md", DOCS["sailing.md"]), "bob"
    )
    assert (await knowledge.index.search(ML_KEY, ["guide"], "sloop mast", 1))[0].document == "sailing.md"


async def test_an_upload_whose_embedding_fails_leaves_no_document(
    knowledge: Knowledge, embedder: HashedEmbedder
) -> None:
    record = await knowledge.store.knowledge.create("guide", ML, "minilm", "alice")
    text = "\n\n".join(f"# Part {i}\n\nwords " * 3 for i in range(70)).encode()
    embedder.fail_after = 1  # the model goes away after the first batch
    with pytest.raises(RuntimeError):
        await knowledge.ingesting.store(record, knowledge.ingesting.prepare("long.md", text), "alice")
    assert await knowledge.store.knowledge.documents("guide") == []
    assert await knowledge.index.search(ML_KEY, ["guide"], "words", 5) == []


async def test_the_query_is_embedded_once_per_search(knowledge: Knowledge, embedder: HashedEmbedder) -> None:
    await _collection(knowledge, "a", ML, {"cooling.md": DOCS["cooling.md"]})
    await _collection(knowledge, "b", ML, {"baking.md": DOCS["baking.md"]})
    embedder.calls.clear()
    await knowledge.index.search(ML_KEY, ["a", "b"], "water", 5)
    assert embedder.calls == [("minilm", 1)]


async def test_pairs_come_with_their_collections_owner(knowledge: Knowledge) -> None:
    await knowledge.store.knowledge.create("guide", ML, "minilm", "alice")
    await knowledge.store.knowledge.set_pairs("guide", [("q", "a")])
    assert await knowledge.pairs.pairs("guide") == (ML, [("q", "a")])
    with pytest.raises(NotFound, match="no knowledge collection 'nope'"):  # as training expects
        await knowledge.pairs.pairs("nope")


def test_fusion_ranks_what_both_rankings_agree_on_first() -> None:
    fused = fuse([["a", "b", "c"], ["d", "b", "e"]])
    assert [item for item, _ in fused][:3] == ["b", "a", "d"]  # second in both beats first in one


def test_bm25_prefers_the_rarer_word() -> None:
    index = Bm25.of(["the cat", "the dog", "the bird", "a cat sat"])
    assert [row for row, _ in index.search("the cat", 2)] == [0, 3]


def test_bm25_scores_are_okapis_formula() -> None:
    texts = ["red fox red", "a quick brown fox jumps", "lazy dog", "red dog barks at the red fox"]
    lengths = [len(text.split()) for text in texts]
    average = sum(lengths) / len(texts)

    def expected(row: int, terms: list[str]) -> float:
        total = 0.0
        for term in terms:
            held = sum(term in text.split() for text in texts)
            idf = math.log(1 + (len(texts) - held + 0.5) / (held + 0.5))
            tf = texts[row].split().count(term)
            total += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lengths[row] / average))
        return total

    found = Bm25.of(texts).search("red fox", 10)
    assert [row for row, _ in found] == [0, 3, 1]
    for row, score in found:
        assert score == pytest.approx(expected(row, ["red", "fox"]), rel=1e-5)
    assert Bm25.of(texts).search("red fox", 1) == found[:1]
    assert Bm25.of(texts).search("unicorn", 5) == []


def test_a_control_plane_reaches_its_own_port_on_loopback_when_it_listens_everywhere() -> None:
    assert own_url("0.0.0.0", 8080) == "http://127.0.0.1:8080"
    assert own_url("::1", 80) == "http://[::1]:80"
    assert own_url("10.0.0.5", 8080) == "http://10.0.0.5:8080"


async def test_a_second_control_plane_on_the_same_store_finds_what_the_first_stored(
    knowledge: Knowledge, embedder: HashedEmbedder
) -> None:
    standby = knowledge_with(knowledge.store, embedder)  # its own in-memory index, the same store
    await _collection(knowledge, "guide", ML, {"cooling.md": DOCS["cooling.md"]})
    assert (await standby.index.search(ML_KEY, ["guide"], "bread yeast", 1))[0].document == "cooling.md"
    record = await knowledge.store.knowledge.get("guide")
    await knowledge.ingesting.store(
        record, knowledge.ingesting.prepare("baking.md", DOCS["baking.md"]), "bob"
    )
    assert (await standby.index.search(ML_KEY, ["guide"], "bread yeast", 1))[0].document == "baking.md"


class GatedPassages:
    """The store's collections, whose passages are read only once :attr:`gate` is set."""

    def __init__(self, store: KnowledgeStore) -> None:
        self.store = store
        self.gate = asyncio.Event()
        self.reads = 0
        self.full_text = store.full_text

    async def passages(self, collection_id: int) -> list[StoredPassage]:
        self.reads += 1
        await self.gate.wait()
        return await self.store.passages(collection_id)

    async def list(self, names: list[str], counted: bool = True) -> list[CollectionRecord]:
        return await self.store.list(names, counted)


async def test_a_search_that_gives_up_leaves_the_index_build_to_finish_once(
    knowledge: Knowledge, embedder: HashedEmbedder
) -> None:
    await _collection(knowledge, "guide", ML, DOCS)
    record = await knowledge.store.knowledge.get("guide")
    gated = GatedPassages(knowledge.store.knowledge)
    index = KnowledgeIndex(gated, embedder)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):  # the gateway's knowledge_timeout_s, say
        await asyncio.wait_for(index.search_in([record], "bread yeast", 1), 0.01)
    waiting = asyncio.ensure_future(index.search_in([record], "bread yeast", 1))
    gated.gate.set()
    assert (await waiting)[0].document == "baking.md"
    assert gated.reads == 1  # the second search joined the build the first one started
    assert (await index.search_in([record], "heavy water", 1))[0].document == "cooling.md"
    assert gated.reads == 1


async def test_a_change_starts_the_new_index_before_any_search(
    knowledge: Knowledge, embedder: HashedEmbedder
) -> None:
    await _collection(knowledge, "guide", ML, {"cooling.md": DOCS["cooling.md"]})
    gated = GatedPassages(knowledge.store.knowledge)
    gated.gate.set()
    index = KnowledgeIndex(gated, embedder)  # type: ignore[arg-type]
    record = await knowledge.store.knowledge.get("guide")
    await knowledge.ingesting.store(
        record, knowledge.ingesting.prepare("baking.md", DOCS["baking.md"]), "bob"
    )
    index.build_soon(record)  # the record read before the upload: the build reads the new revision
    changed = await knowledge.store.knowledge.get("guide")
    assert changed.revision == record.revision + 1
    await eventually(lambda: index.held(record.id) == changed.revision, message="the new index is built")
    assert (await index.search_in([changed], "bread yeast", 1))[0].document == "baking.md"
    assert gated.reads == 1  # the search found the index built


async def test_a_run_of_changes_builds_the_index_at_most_twice(
    knowledge: Knowledge, embedder: HashedEmbedder
) -> None:
    await _collection(knowledge, "guide", ML, {"cooling.md": DOCS["cooling.md"]})
    gated = GatedPassages(knowledge.store.knowledge)
    index = KnowledgeIndex(gated, embedder)  # type: ignore[arg-type]
    record = await knowledge.store.knowledge.get("guide")
    index.build_soon(record)
    await eventually(lambda: gated.reads == 1, message="the first build reads the passages")
    for name in ("baking.md", "sailing.md"):  # uploaded while the first build is under way
        await knowledge.ingesting.store(record, knowledge.ingesting.prepare(name, DOCS[name]), "bob")
        index.build_soon(record)
    await knowledge.store.knowledge.remove_document("guide", "cooling.md")
    index.build_soon(record)
    last = (await knowledge.store.knowledge.get("guide")).revision
    gated.gate.set()
    await eventually(lambda: index.held(record.id) == last, message="the latest revision is built")
    assert gated.reads == 2  # the first build, then one for the three changes made meanwhile
    found = await index.search_in([await knowledge.store.knowledge.get("guide")], "heavy water", 3)
    assert {p.document for p in found} == {"baking.md", "sailing.md"}
