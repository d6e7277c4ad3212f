"""An index of the fleet's free cards, so that placing a replica looks at the best node first.

:func:`llmgw.core.placement.place` weighs every node, with its reason, for each
replica: at a thousand nodes that is about 7 ms a replica, and a new catalog of
a thousand replicas takes seconds. :class:`FreeCards` keeps each node's free
memory per usable card (and its host memory) as replicas are added and removed,
and, for each way of asking (a card class or any, one device or several, how
many cards), the nodes ordered by the memory of their k-th freest card. The
usual placement — a node without a replica of the model, with the cards free —
is then found by looking at the top of that order (:meth:`FreeCards.best`), and
is the very node and cards :func:`~llmgw.core.placement.place` picks. Every
other case (every card-fitting node already runs the model, only host memory
fits, a replica spanning several nodes) answers None, and the caller weighs
every node as before. The decision's refusals name the nodes not looked at in
one summarised reason (:data:`NOT_LOOKED_AT`) rather than one line per node.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable

from llmgw.core.devices import NodeInventory
from llmgw.core.mig import Spread, is_mig_class
from llmgw.core.placement import Decision, Placed

NOT_LOOKED_AT = "other nodes"
"""The refusals' key for the nodes a placement from the index did not weigh one by one."""

Way = tuple[str | None, bool, int]
"""How a replica asks for cards: a class (None: any), whether MIG instances may serve it, how many."""


class FreeCards:
    """Each node's free card and host memory, kept up to date as replicas come and go."""

    def __init__(self, nodes: Iterable[NodeInventory], placed: Iterable[Placed] = ()) -> None:
        self._nodes: dict[str, NodeInventory] = {}
        self._order: dict[str, int] = {}
        self._cards: dict[str, dict[int, int]] = {}
        """Each node's usable cards (and MIG instances) with the memory free on each."""
        self._serving: dict[str, dict[Way, tuple[int, ...]]] = {}
        """Per node and way of asking, the cards that may serve it (kept until the node changes)."""
        self._host: dict[str, int] = {}
        self._models: dict[str, Counter[str]] = {}
        """Each model's replicas by node."""
        self._version: dict[str, int] = {}
        self._heaps: dict[Way, list[tuple[int, int, str, int]]] = {}
        """For each way asked so far: (-memory of the k-th freest card, order, node, version)."""
        self._placed: dict[str, list[Placed]] = {}
        for node in nodes:
            self.node_joined(node)
        for replica in placed:
            self.add(replica)

    # changes ---------------------------------------------------------------------------------------
    def node_joined(self, node: NodeInventory) -> None:
        """A node joined or its inventory changed: its free memory is its inventory's less its replicas'."""
        self._nodes[node.node_id] = node
        self._order.setdefault(node.node_id, len(self._order))
        self._serving.pop(node.node_id, None)
        self._recount(node.node_id)

    def node_left(self, node_id: str) -> None:
        """A node left: it is offered no more (its replicas stay counted, should it come back)."""
        if self._nodes.pop(node_id, None) is not None:
            self._serving.pop(node_id, None)
            self._cards.pop(node_id, None)
            self._host.pop(node_id, None)
            self._version[node_id] = self._version.get(node_id, 0) + 1

    def add(self, replica: Placed) -> None:
        """A replica now holds its memory on its node."""
        self._placed.setdefault(replica.node_id, []).append(replica)
        self._models.setdefault(replica.model, Counter())[replica.node_id] += 1
        cards = self._cards.get(replica.node_id)
        if cards is None:  # the node is away: counted when it joins again
            self._version[replica.node_id] = self._version.get(replica.node_id, 0) + 1
            return
        for index in replica.devices:  # what _recount would subtract, without counting the node again
            if index in cards:
                cards[index] -= replica.memory_mb // max(1, len(replica.devices))
        if not replica.devices:
            self._host[replica.node_id] -= replica.memory_mb
        self._changed(replica.node_id)

    def remove(self, replica_id: str) -> None:
        """A replica no longer holds its memory (stopped, moved)."""
        for node_id, replicas in self._placed.items():
            for replica in replicas:
                if replica.replica_id == replica_id:
                    replicas.remove(replica)
                    self._models[replica.model][node_id] -= 1
                    self._recount(node_id)
                    return

    # reads -------------------------------------------------------------------------------------------
    def free(self, node_id: str) -> tuple[dict[int, int], int]:
        """A node's usable cards with their free memory, and its free host memory."""
        return dict(self._cards.get(node_id, {})), self._host.get(node_id, 0)

    def best(
        self, model: str, memory_mb: int, spread: Spread | None = None, *, gpu_class: str | None = None
    ) -> Decision | None:
        """Where :func:`~llmgw.core.placement.place` puts one more replica of ``model`` when a node
        without one has the cards free; None when no such node does (weigh every node then)."""
        spread = spread or Spread()
        if spread.nodes > 1:
            return None
        gpus = max(1, spread.tp, spread.gpus)
        share = -(-memory_mb // gpus)
        way: Way = (gpu_class, spread.single_device, gpus)
        heap = self._heap(way)
        running = self._models.get(model, Counter())
        passed: list[tuple[int, int, str, int]] = []
        found = ""
        while heap:
            entry = heap[0]
            negative, _, node_id, version = entry
            if self._version.get(node_id) != version or node_id not in self._nodes:
                heapq.heappop(heap)  # stale: the node changed or left since
                continue
            if -negative < share:
                break  # the freest is too small: so is every one below
            if running[node_id] == 0:
                found = node_id
                break
            passed.append(heapq.heappop(heap))  # runs the model already: looked at after the others
        for entry in passed:
            heapq.heappush(heap, entry)
        if not found:
            return None
        cards = self._usable(found, way)
        fitting = [index for index, free in cards.items() if free >= share]
        chosen = sorted(fitting, key=lambda index: cards[index], reverse=True)[:gpus]
        others = len(self._nodes) - 1
        why = (
            f"not weighed one by one: {found} has the most memory on its "
            f"{'card' if gpus == 1 else f'{gpus} freest cards'}"
            + (f" of class {gpu_class}" if gpu_class else "")
            + f" among the nodes without a replica of {model}"
        )
        refusals = {NOT_LOOKED_AT: f"{others} node(s) {why}"} if others else {}
        return Decision(node_id=found, devices=tuple(sorted(chosen)), refusals=refusals)

    # inside ------------------------------------------------------------------------------------------
    def _recount(self, node_id: str) -> None:
        node = self._nodes.get(node_id)
        self._version[node_id] = self._version.get(node_id, 0) + 1
        if node is None:
            return
        here = self._placed.get(node_id, [])
        cards = {gpu.index: gpu.memory_free_mb for gpu in node.gpus if not gpu.unavailable}
        for replica in here:
            for index in replica.devices:
                if index in cards:
                    cards[index] -= replica.memory_mb // max(1, len(replica.devices))
        self._cards[node_id] = cards
        self._host[node_id] = node.memory_mb - sum(r.memory_mb for r in here if not r.devices)
        for way, heap in self._heaps.items():
            heapq.heappush(heap, self._entry(node_id, way))

    def _changed(self, node_id: str) -> None:
        """The node's free memory changed: its entries in every order are pushed again."""
        self._version[node_id] = self._version.get(node_id, 0) + 1
        for way, heap in self._heaps.items():
            heapq.heappush(heap, self._entry(node_id, way))

    def _usable(self, node_id: str, way: Way) -> dict[int, int]:
        """The node's cards that may serve a replica asking ``way``, with their free memory."""
        serving = self._serving.setdefault(node_id, {})
        indices = serving.get(way)
        cards = self._cards[node_id]
        if indices is None:
            gpu_class, single, _ = way
            classes = {gpu.index: gpu.device_class for gpu in self._nodes[node_id].gpus}
            indices = tuple(
                index
                for index in cards
                if (single or not is_mig_class(classes.get(index, "")))
                and (not gpu_class or classes.get(index) == gpu_class)
            )
            serving[way] = indices
        return {index: cards[index] for index in indices}

    def _entry(self, node_id: str, way: Way) -> tuple[int, int, str, int]:
        frees = sorted(self._usable(node_id, way).values(), reverse=True)
        k = way[2]
        kth = frees[k - 1] if len(frees) >= k else -1
        return (-kth, self._order[node_id], node_id, self._version[node_id])

    def _heap(self, way: Way) -> list[tuple[int, int, str, int]]:
        heap = self._heaps.get(way)
        if heap is None:
            heap = [self._entry(node_id, way) for node_id in self._nodes]
            heapq.heapify(heap)
            self._heaps[way] = heap
        return heap
