"""Eviction: lower priorities make room, siblings never, draining replicas count as gone."""

from __future__ import annotations

from llmgw.core.devices import Device, NodeInventory
from llmgw.core.eviction import plan_eviction
from llmgw.core.placement import Ask, Decision, Placed, place_profiles


def node(node_id: str, *free_mb: int) -> NodeInventory:
    cpu = Device(kind="cpu", index=0, name="CPU", memory_mb=4000, memory_free_mb=4000)
    cards = tuple(
        Device(
            kind="nvidia", index=i, name="NVIDIA L4", memory_mb=24000, memory_free_mb=free, device_class="l4"
        )
        for i, free in enumerate(free_mb)
    )
    return NodeInventory(node_id=node_id, address="x", cpu_cores=8, memory_mb=4000, devices=(cpu, *cards))


def replica(replica_id: str, model: str, memory_mb: int, priority: int = 0, **more: object) -> Placed:
    return Placed(model, "n1", memory_mb, (0,), replica_id=replica_id, priority=priority, **more)  # type: ignore[arg-type]


ASK = [Ask(16000, gpu_class="l4")]


def evict(
    placed: list[Placed],
    priority: int = 5,
    nodes: list[NodeInventory] | None = None,
    environment: str = "",
    model: str = "big",
) -> Decision:
    nodes = nodes or [node("n1", 24000)]
    unplaced = place_profiles(model, ASK, nodes, placed)
    assert not unplaced.placed
    return plan_eviction(model, priority, ASK, nodes, placed, unplaced, environment=environment)


def test_the_lowest_priority_goes_first_and_only_as_many_as_needed() -> None:
    placed = [replica("mid", "b", 8000, priority=2), replica("low", "a", 8000, priority=1)]
    decision = evict(placed)
    assert (decision.evict_node, decision.evict) == ("n1", ("low",))
    assert decision.kept["mid"] == "not needed: the replicas evicted free enough"
    assert not decision.placed


def test_equal_or_higher_priorities_are_kept_with_the_reason() -> None:
    decision = evict([replica("same", "a", 16000, priority=5), replica("high", "b", 4000, priority=9)])
    assert decision.evict == ()
    assert decision.evict_node == ""
    assert decision.kept == {"same": "priority 5, not below 5", "high": "priority 9, not below 5"}
    assert decision.refusals["n1"]  # the placement's reason stays


def test_siblings_are_never_evicted() -> None:
    placed = [
        replica("mine", "big", 16000, priority=0),
        replica("env", "e", 16000, priority=0, environment="comfy"),
    ]
    decision = evict(placed, environment="comfy")
    assert decision.evict == ()
    assert decision.kept["mine"] == "a replica of the same model: siblings never evict each other"
    assert decision.kept["env"] == "serves environment comfy, as the replica asked for does"


def test_draining_replicas_count_as_gone_so_nothing_more_is_evicted() -> None:
    placed = [replica("going", "a", 16000, draining=True), replica("low", "b", 4000, priority=-1)]
    decision = evict(placed)
    assert decision.evict == ()
    assert decision.waiting_for == ("going",)
    assert decision.kept["going"] == "already draining"


def test_room_drained_for_a_higher_priority_is_not_waited_for() -> None:
    """The model whose replica is evicted does not count that replica's room as coming free."""
    placed = [replica("evicted", "a", 16000, priority=0, draining=True)]
    decision = evict(placed, priority=0, model="a2")
    assert (decision.evict, decision.waiting_for, decision.evict_node) == ((), (), "")
    assert decision.kept["evicted"] == "priority 0, not below 0"


def test_the_node_needing_fewest_evictions_is_chosen() -> None:
    nodes = [node("n1", 24000), node("n2", 24000)]
    placed = [
        replica("a1", "a", 6000), replica("a2", "b", 6000), replica("a3", "d", 6000),
        Placed("c", "n2", 10000, (0,), replica_id="c1"),
    ]  # fmt: skip
    decision = evict(placed, nodes=nodes)
    assert (decision.evict_node, decision.evict) == ("n2", ("c1",))
    assert decision.kept["a1"].startswith("on n1; evicting on n2")


def test_nothing_to_evict_that_would_free_enough() -> None:
    decision = evict([replica("low", "a", 2000, priority=-3)], nodes=[node("n1", 12000)])
    assert decision.evict == ()
    assert decision.evict_node == ""
