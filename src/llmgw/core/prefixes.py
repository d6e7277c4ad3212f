"""An approximate prefix tree: which replicas were last sent which prompt beginnings.

The router cannot see every engine's cache, but it knows where it sent each
prompt. :class:`PrefixTree` cuts a prompt's text into fixed-size chunks and
names each chunk by a hash chained over the chunks before it, so a node
stands for a whole prefix (a radix tree over chunks, stored flat by name).
Each node remembers the replicas that were sent that prefix, most recent
last. A prompt sent with a cache salt (a request that searched knowledge
collections: :func:`llmgw.core.knowledge.cache_salt`) chains its names from the
salt, so it shares no node with the same text under another salt or none, as
the engine's cache shares no block. Memory is bounded: at most ``max_nodes`` nodes, the least recently
used evicted first (a prefix's children are always used after it, so leaves
go before their parents), and at most ``max_holders`` replicas per node.

It is approximate: an engine may have evicted what the tree remembers, and
the tree forgets what it evicts; the exact view is :mod:`llmgw.core.kvblocks`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection


class PrefixTree:
    """Prompt prefixes (in chunks of ``chunk_chars`` characters) → replicas sent them."""

    def __init__(self, max_nodes: int = 100_000, chunk_chars: int = 128, max_holders: int = 4,
                 max_chunks: int = 512) -> None:  # fmt: skip
        if max_nodes < 1 or chunk_chars < 1 or max_holders < 1 or max_chunks < 1:
            raise ValueError("a prefix tree needs max_nodes, chunk_chars, max_holders and max_chunks ≥ 1")
        self.max_nodes = max_nodes
        self.chunk_chars = chunk_chars
        self.max_holders = max_holders
        self.max_chunks = max_chunks
        """Only this many leading chunks of a prompt are looked at (a bound on work per request)."""
        self._nodes: OrderedDict[int, list[str]] = OrderedDict()
        self.evicted = 0
        """Nodes dropped to stay within ``max_nodes``."""
        self._roots: set[int] = set()
        self.roots: dict[str, int] = {}
        """Per replica, how many distinct prompt beginnings (first chunks) it was sent: its share of
        the distinct prefixes, which the router evens out when a prompt starts like none before."""

    def _count_root(self, name: int, replica: str, change: int) -> None:
        if name in self._roots:
            left = self.roots.get(replica, 0) + change
            if left > 0:
                self.roots[replica] = left
            else:
                self.roots.pop(replica, None)

    def _names(self, text: str, salt: str = "") -> list[int]:
        size = self.chunk_chars
        limit = min(len(text) // size, self.max_chunks)
        names = []
        name = hash(salt) if salt else 0
        for start in range(0, limit * size, size):
            name = hash((name, text[start : start + size]))
            names.append(name)
        return names

    def match(
        self, text: str, replicas: Collection[str] | None = None, salt: str = ""
    ) -> tuple[dict[str, int], int]:
        """Per replica, how many leading full chunks of ``text`` it was sent; and the chunk count.

        ``replicas``: only these are counted (others, e.g. gone ones, are left out). ``salt``: the
        request's cache salt; the same text under another salt (or none) shares no chunk.
        """
        names = self._names(text, salt)
        depth: dict[str, int] = {}
        nodes = self._nodes
        for index, name in enumerate(names):
            holders = nodes.get(name)
            if holders is None:
                break
            for replica in holders:
                if replicas is None or replica in replicas:
                    depth[replica] = index + 1
        return depth, len(names)

    def insert(self, text: str, replica: str, salt: str = "") -> None:
        """Remember that ``text`` (under cache ``salt``) was sent to ``replica``."""
        nodes = self._nodes
        for index, name in enumerate(self._names(text, salt)):
            holders = nodes.get(name)
            if holders is None:
                nodes[name] = [replica]
                if index == 0:
                    self._roots.add(name)
                    self._count_root(name, replica, 1)
            else:
                nodes.move_to_end(name)
                if replica in holders:
                    if holders[-1] != replica:
                        holders.remove(replica)
                        holders.append(replica)
                else:
                    holders.append(replica)
                    self._count_root(name, replica, 1)
                    if len(holders) > self.max_holders:
                        self._count_root(name, holders.pop(0), -1)
        while len(nodes) > self.max_nodes:
            name, holders = nodes.popitem(last=False)
            for holder in holders:
                self._count_root(name, holder, -1)
            self._roots.discard(name)
            self.evicted += 1

    def forget(self, replica: str) -> None:
        """Drop ``replica`` everywhere (it left); nodes left with no holder go."""
        for name in list(self._nodes):
            holders = self._nodes[name]
            if replica in holders:
                holders.remove(replica)
                self._count_root(name, replica, -1)
                if not holders:
                    del self._nodes[name]
                    self._roots.discard(name)

    def __len__(self) -> int:
        return len(self._nodes)
