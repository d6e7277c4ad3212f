"""Adapter residency: go where the adapter is, unless saturated; make room by unloading LRU idle ones."""

from __future__ import annotations

import pytest

from llmgw.core.adapters import AdapterPlan, AdapterResidency
from llmgw.core.routing import ReplicaLoad


def _loads(*in_flight: int, capacity: int = 2) -> list[ReplicaLoad]:
    return [ReplicaLoad(f"r{i}", in_flight=n, capacity=capacity) for i, n in enumerate(in_flight)]


def test_a_holding_replica_takes_the_request_unless_saturated() -> None:
    residency = AdapterResidency(max_loaded=2)
    residency.mark_loaded("r1", "sql")
    assert residency.plan("sql", _loads(0, 1)) == AdapterPlan("r1", load=False)
    # r1 saturated: the adapter is loaded on the idle r0 instead.
    assert residency.plan("sql", _loads(0, 2)) == AdapterPlan("r0", load=True)


def test_room_is_made_by_unloading_the_least_recently_used_idle_adapter() -> None:
    residency = AdapterResidency(max_loaded=2)
    residency.mark_loaded("r0", "a")
    residency.mark_loaded("r0", "b")
    residency.begin("r0", "a")  # a busy, and now the most recently used
    assert residency.loaded("r0") == ["b", "a"]
    assert residency.plan("c", _loads(0)) == AdapterPlan("r0", load=True, unload="b")
    residency.begin("r0", "b")
    assert residency.plan("c", _loads(0)) is None  # both busy: no room anywhere
    residency.end("r0", "a")
    assert residency.plan("c", _loads(0)) == AdapterPlan("r0", load=True, unload="a")


def test_unreadable_replicas_take_nothing_and_forgotten_ones_hold_nothing() -> None:
    residency = AdapterResidency(max_loaded=1)
    residency.mark_loaded("r0", "a")
    loads = _loads(0, 0)
    loads[0].readable = False
    assert residency.plan("a", loads) == AdapterPlan("r1", load=True)
    residency.forget("r0")
    assert residency.holders("a") == []
    with pytest.raises(ValueError, match="at least 1"):
        AdapterResidency(0)
