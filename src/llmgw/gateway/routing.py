"""The router's choice among a model's ready replicas: by load, prompt prefix, KV blocks held.

:class:`Router` is what :meth:`ReplicaTable.pick <llmgw.gateway.replicas.ReplicaTable.pick>`
asks. Its policy (:class:`RoutingSettings`) is one of:

- ``round-robin``: each readable replica in turn;
- ``least-loaded``: the lowest share of capacity in use (this router's
  in-flight requests or the engine's own count, whichever is higher);
- ``prefix``: the replica the approximate prefix tree says was sent the
  longest start of this prompt, unless saturated (:func:`llmgw.core.routing.with_affinity`);
- ``kv``: the replica holding the largest share of the prompt's leading KV
  blocks (from the engines' KV events, hashed as vLLM does with each
  replica's own block size, as its events report it), falling back to the
  tree when no replica holds the first block or the model has no KV events.
  A replica whose agent found its hashes disagreeing with llmgw's
  (:attr:`Router.mismatched`) is counted in ``llmgw_kv_replicas_mismatched``.

Every decision is counted in ``llmgw_prefix_decisions_total{kind}`` and
timed in ``llmgw_routing_decision_seconds``; everything runs on the event
loop's thread, in microseconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field

from llmgw.core.kvblocks import BlockHasher, KvIndex
from llmgw.core.prefixes import PrefixTree
from llmgw.core.routing import ReplicaLoad, least_loaded, with_affinity

Policy = Literal["round-robin", "least-loaded", "prefix", "kv"]

DECISIONS = Counter(
    "llmgw_prefix_decisions",
    "Routing decisions by what decided them: kv (blocks held), tree (approximate prefix), "
    "none (no replica known to hold the prompt's start), saturated (the best-placed replica was "
    "saturated, load decided), load (a policy without affinity).",
    ["kind"],
)
DECISION_SECONDS = Histogram(
    "llmgw_routing_decision_seconds",
    "Time the router took to choose a replica for one request.",
    buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3),
)
KV_BLOCKS = Gauge("llmgw_kv_index_blocks", "KV blocks the router knows some replica holds.")
PREFIX_NODES = Gauge("llmgw_prefix_tree_nodes", "Nodes in the router's approximate prefix trees.")
MISMATCHED = Gauge(
    "llmgw_kv_replicas_mismatched",
    "Replicas whose KV events name blocks by other hashes than the router computes (another hash "
    "algorithm or seed): KV-aware routing never finds their blocks. ctl replicas says why.",
)


class RoutingSettings(BaseModel):
    """How the router chooses among a model's replicas."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    policy: Policy = "kv"
    """round-robin, least-loaded, prefix (approximate tree) or kv (blocks held, then the tree)."""
    saturation: float = Field(default=1.5, gt=0)
    """Utilisation (requests on a replica per request it serves at once) from which a replica
    takes nothing on affinity: load balance overrides the prefix."""
    load_weight: float = Field(default=0.5, ge=0)
    """How much a replica's utilisation counts against the share of the prompt it holds."""
    spread_weight: float = Field(default=1.0, ge=0)
    """For a prompt no replica holds: how much a replica's count of distinct cached prefixes,
    as a multiple of the replicas' mean, counts against it. At 1.0 one prefix more than the
    mean of two outweighs the load term up to a utilisation of 1; saturation still overrides."""
    prefix_nodes: int = Field(default=200_000, ge=1)
    """Most nodes in each model's prefix tree (least recently used evicted first)."""
    chunk_chars: int = Field(default=128, ge=1)
    """Characters per prefix-tree chunk."""


class Router:
    """Per model a prefix tree, one KV index over every replica, and the choice between replicas."""

    def __init__(
        self, settings: RoutingSettings | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.settings = settings or RoutingSettings()
        self.clock = clock
        self.kv = KvIndex()
        self._trees: dict[str, PrefixTree] = {}
        self._hashers: dict[tuple[str, int], BlockHasher] = {}
        """One hasher per (seed, block size), shared by the replicas that hash alike."""
        self._replica_hashers: dict[str, BlockHasher] = {}
        self._hashed: dict[str, set[str]] = {}
        """Per model, its replicas whose block hashing is known."""
        self.mismatched: dict[str, str] = {}
        """Replicas whose agents found their hashes disagreeing with llmgw's, and why."""
        self._turn = 0
        self._counters = {
            kind: DECISIONS.labels(kind) for kind in ("kv", "tree", "none", "saturated", "load")
        }
        KV_BLOCKS.set_function(lambda: len(self.kv))
        PREFIX_NODES.set_function(lambda: sum(len(t) for t in self._trees.values()))
        MISMATCHED.set_function(lambda: len(self.mismatched))

    # -- what the router learns ----------------------------------------------------------------

    def set_block_hashing(
        self, replica_id: str, model: str, seed: str, block_size: int, mismatch: str = ""
    ) -> None:
        """``replica_id`` (of ``model``) publishes KV events, hashing blocks of ``block_size``
        tokens from this seed (0: its size is not known yet, it has stored nothing).
        ``mismatch``: why its agent found its hashes disagreeing with this hashing."""
        if mismatch:
            self.mismatched[replica_id] = mismatch
        else:
            self.mismatched.pop(replica_id, None)
        if block_size < 1:
            self._replica_hashers.pop(replica_id, None)
            hashed = self._hashed.get(model)
            if hashed is not None:
                hashed.discard(replica_id)
                if not hashed:
                    del self._hashed[model]
            return
        hasher = self._hashers.get((seed, block_size))
        if hasher is None:
            hasher = self._hashers[(seed, block_size)] = BlockHasher(seed, block_size)
        self._replica_hashers[replica_id] = hasher
        self._hashed.setdefault(model, set()).add(replica_id)

    def block_size(self, replica_id: str) -> int:
        """The block size ``replica_id``'s prompts are hashed with; 0 while unknown."""
        hasher = self._replica_hashers.get(replica_id)
        return hasher.block_size if hasher is not None else 0

    def wants_tokens(self, model: str) -> bool:
        """True when the policy is kv and ``model``'s blocks are known: its prompts are worth tokenizing."""
        return self.settings.policy == "kv" and model in self._hashed

    def forget(self, replica_id: str) -> None:
        """The replica left: it holds nothing."""
        self.kv.clear(replica_id)
        self.mismatched.pop(replica_id, None)
        if self._replica_hashers.pop(replica_id, None) is not None:
            for model, hashed in list(self._hashed.items()):
                hashed.discard(replica_id)
                if not hashed:
                    del self._hashed[model]
        for tree in self._trees.values():
            tree.forget(replica_id)

    def tree(self, model: str) -> PrefixTree:
        tree = self._trees.get(model)
        if tree is None:
            s = self.settings
            tree = self._trees[model] = PrefixTree(s.prefix_nodes, s.chunk_chars)
        return tree

    # -- the choice ------------------------------------------------------------------------------

    def choose(
        self,
        model: str,
        loads: Sequence[ReplicaLoad],
        prompt: str = "",
        tokens: Sequence[int] | None = None,
        salt: str = "",
    ) -> ReplicaLoad | None:
        """The replica of ``model`` (among ``loads``) that takes a request for ``prompt``.

        ``salt``: the request's cache salt (it searched knowledge collections): its prompt's
        prefix and blocks are keyed under it, apart from the same text under another salt or none.
        """
        started = self.clock()
        self._turn += 1
        turn = self._turn
        policy = self.settings.policy
        kind = "load"
        if policy == "round-robin":
            readable = [load for load in loads if load.readable]
            chosen = readable[turn % len(readable)] if readable else None
        elif policy == "least-loaded" or not prompt:
            chosen = least_loaded(loads, turn)
        else:
            affinity, kind = self._affinity(model, loads, prompt, tokens if policy == "kv" else None, salt)
            s = self.settings
            chosen = with_affinity(loads, affinity, turn, s.saturation, s.load_weight)
            if chosen is not None and kind != "none":
                top = max(affinity.values())
                if affinity.get(chosen.replica_id, 0.0) < top:
                    kind = "saturated"
            if chosen is not None and kind != "kv":
                # Where the KV index already knows, the tree need not (it is the fallback).
                self.tree(model).insert(prompt, chosen.replica_id, salt)
        self._counters[kind].inc()
        DECISION_SECONDS.observe(self.clock() - started)
        return chosen

    def _affinity(
        self,
        model: str,
        loads: Sequence[ReplicaLoad],
        prompt: str,
        tokens: Sequence[int] | None,
        salt: str = "",
    ) -> tuple[dict[str, float], str]:
        ids = {load.replica_id for load in loads}
        if tokens is not None and model in self._hashed:
            # Each replica's blocks are hashed with its own block size: replicas that hash alike
            # (nearly always all of them) share one chain of keys.
            groups: dict[int, tuple[BlockHasher, set[str]]] = {}
            for replica in ids:
                hasher = self._replica_hashers.get(replica)
                if hasher is not None:
                    groups.setdefault(id(hasher), (hasher, set()))[1].add(replica)
            shares: dict[str, float] = {}
            for hasher, members in groups.values():
                keys = hasher.keys(tokens, salt)
                if keys:
                    total = len(keys)
                    for replica, count in self.kv.leading(keys, members).items():
                        shares[replica] = count / total
            if shares:
                return shares, "kv"
        tree = self.tree(model)
        depth, chunks = tree.match(prompt, ids, salt)
        if not depth:
            # A prompt starting like none before: even out the distinct prefixes each replica
            # caches, so that every replica's share of the hot prefixes fits its cache. Counted
            # against the mean, so one more prefix matters where replicas hold a few (shared
            # system prompts), and hardly where each holds thousands (prompts never shared).
            counts = {r: count for r, count in tree.roots.items() if r in ids}
            total = sum(counts.values())
            if not total:
                return {}, "none"
            scale = self.settings.spread_weight * len(ids) / total
            return {r: -scale * count for r, count in counts.items()}, "none"
        return {replica: count / chunks for replica, count in depth.items()}, "tree"
