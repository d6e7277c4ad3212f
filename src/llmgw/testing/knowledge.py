"""An in-memory :class:`~llmgw.core.knowledge.KnowledgeSearch` for tests, and a control plane serving it.

:class:`InMemoryKnowledge` holds collections (each with an owner and its
passages) and answers a search by counting the query's words in each passage,
as the real index would by relevance: best first, ``limit`` of them. It keeps
owners apart as the real one does (:func:`llmgw.core.tenancy.visible`), records
every search, and fails every search while :attr:`InMemoryKnowledge.failing`
is set (an embedding model down).

``python -m llmgw.testing.knowledge --config SERVER.yaml --collections FILE``
runs a control plane (as ``llmgw server run`` does) whose gateway searches the
collections in FILE (JSON: ``{NAME: {"owner": OWNER, "documents": {DOC: [TEXT, ...]}}}``):
the seam end-to-end tests use until the cluster's own index is wired.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.core.knowledge import Passage, UnknownCollection
from llmgw.core.tenancy import CLUSTER, Owner, Place, visible

_WORD = re.compile(r"\w+")


@dataclass
class Collection:
    owner: Owner
    passages: list[Passage] = field(default_factory=list)


class InMemoryKnowledge:
    """Collections in memory, searched by shared words."""

    def __init__(self) -> None:
        self.collections: dict[str, Collection] = {}
        self.searches: list[tuple[Place, tuple[str, ...], str, int]] = []
        """Every search asked: the caller's place, the collections, the query, the limit."""
        self.failing: Exception | None = None
        """Raised by every search while set."""

    def add(self, name: str, owner: Owner, documents: dict[str, list[str]]) -> None:
        """A collection of ``documents`` (name → its passages' texts, in order)."""
        passages = [
            Passage(name, document, position, text, 0.0)
            for document, texts in documents.items()
            for position, text in enumerate(texts)
        ]
        self.collections[name] = Collection(owner, passages)

    async def search(
        self, place: Place, collections: Sequence[str], query: str, limit: int
    ) -> Sequence[Passage]:
        self.searches.append((place, tuple(collections), query, limit))
        if self.failing is not None:
            raise self.failing
        words = {w.lower() for w in _WORD.findall(query)}
        found: list[Passage] = []
        for name in collections:
            collection = self.collections.get(name)
            if collection is None or not visible(collection.owner, place):
                raise UnknownCollection(name)
            for passage in collection.passages:
                shared = words & {w.lower() for w in _WORD.findall(passage.text)}
                if shared:
                    score = len(shared) / len(words)
                    found.append(Passage(passage.collection, passage.document, passage.position,
                                         passage.text, score))  # fmt: skip
        found.sort(key=lambda p: (-p.score, p.collection, p.document, p.position))
        return found[:limit]

    @classmethod
    def from_file(cls, path: Path) -> InMemoryKnowledge:
        """Collections as the module's docstring describes the file."""
        knowledge = cls()
        for name, spec in json.loads(path.read_text()).items():
            owner = Owner.parse(spec["owner"]) if spec.get("owner") else CLUSTER
            knowledge.add(name, owner, {d: list(texts) for d, texts in spec["documents"].items()})
        return knowledge


async def _serve(config_path: Path, collections: Path) -> None:
    from llmgw.agent.config import settings_problems
    from llmgw.cli.output import setup_logging
    from llmgw.controlplane.config import load_server_config
    from llmgw.controlplane.running import ControlPlane

    setup_logging("info", False)
    config = load_server_config(config_path)
    plane = ControlPlane(config, settings_problems, knowledge=InMemoryKnowledge.from_file(collections))
    await plane.run()  # until a stop signal


def main() -> None:
    parser = argparse.ArgumentParser(description="a control plane searching in-memory collections")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--collections", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.config, args.collections))


if __name__ == "__main__":
    main()
