"""LoRA adapter residency: which replica holds which adapter, and what to unload for a new one.

With ``max_loaded_adapters`` N a vLLM replica holds at most N adapters,
loaded at run time. :class:`AdapterResidency` keeps, per replica, its
adapters from least to most recently used and how many requests use each
now. :meth:`AdapterResidency.plan` answers where an adapter's request goes:
a replica holding it that is not saturated; else the least loaded replica
with room, or with an idle adapter to unload (the least recently used one).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.core.routing import ReplicaLoad, least_loaded


@dataclass(frozen=True, slots=True)
class AdapterPlan:
    """Where an adapter's request goes, and what must happen there first."""

    replica_id: str
    load: bool
    """The adapter must be loaded on the replica first."""
    unload: str | None = None
    """An idle adapter to unload first to make room."""


class AdapterResidency:
    """Per replica: its loaded adapters (least recently used first) and their requests in flight."""

    def __init__(self, max_loaded: int) -> None:
        if max_loaded < 1:
            raise ValueError("max_loaded must be at least 1 (adapters a replica holds at once)")
        self.max_loaded = max_loaded
        self._loaded: dict[str, OrderedDict[str, int]] = {}

    def holders(self, adapter: str) -> list[str]:
        return [replica for replica, held in self._loaded.items() if adapter in held]

    def loaded(self, replica: str) -> list[str]:
        """``replica``'s adapters, least recently used first."""
        return list(self._loaded.get(replica, ()))

    def mark_loaded(self, replica: str, adapter: str) -> None:
        held = self._loaded.setdefault(replica, OrderedDict())
        held.setdefault(adapter, 0)
        held.move_to_end(adapter)

    def mark_unloaded(self, replica: str, adapter: str) -> None:
        self._loaded.get(replica, OrderedDict()).pop(adapter, None)

    def forget(self, replica: str) -> None:
        """The replica left or restarted: it holds nothing."""
        self._loaded.pop(replica, None)

    def begin(self, replica: str, adapter: str) -> None:
        """A request using ``adapter`` started on ``replica`` (it becomes most recently used)."""
        held = self._loaded.setdefault(replica, OrderedDict())
        held[adapter] = held.get(adapter, 0) + 1
        held.move_to_end(adapter)

    def end(self, replica: str, adapter: str) -> None:
        held = self._loaded.get(replica)
        if held is not None and held.get(adapter, 0) > 0:
            held[adapter] -= 1

    def _victim(self, replica: str) -> tuple[bool, str | None]:
        """(room can be made, the adapter to unload for it or None when there is room already)."""
        held = self._loaded.get(replica, OrderedDict())
        if len(held) < self.max_loaded:
            return True, None
        for adapter, users in held.items():
            if users == 0:
                return True, adapter
        return False, None

    def plan(
        self, adapter: str, replicas: Sequence[ReplicaLoad], turn: int = 0, saturation: float = 1.0
    ) -> AdapterPlan | None:
        """Where a request for ``adapter`` goes; None when no readable replica can take it now."""
        readable = [r for r in replicas if r.readable]
        holding = [r for r in readable if adapter in self._loaded.get(r.replica_id, ())]
        calm = [r for r in holding if r.utilisation < saturation]
        if calm:
            chosen = least_loaded(calm, turn)
            assert chosen is not None
            return AdapterPlan(chosen.replica_id, load=False)
        roomy: list[tuple[ReplicaLoad, str | None]] = []
        for load in readable:
            if load in holding:
                continue
            possible, victim = self._victim(load.replica_id)
            if possible:
                roomy.append((load, victim))
        if roomy:
            chosen = least_loaded([r for r, _ in roomy], turn)
            assert chosen is not None
            victim = next(v for r, v in roomy if r is chosen)
            return AdapterPlan(chosen.replica_id, load=True, unload=victim)
        if holding:
            chosen = least_loaded(holding, turn)
            assert chosen is not None
            return AdapterPlan(chosen.replica_id, load=False)
        return None
