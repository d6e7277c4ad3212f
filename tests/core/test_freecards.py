"""The free-card index agrees with a full scan after any changes, and picks what placement picks."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.core.devices import Device, NodeInventory
from llmgw.core.freecards import NOT_LOOKED_AT, FreeCards
from llmgw.core.mig import Spread
from llmgw.core.placement import Placed, free_gpu_memory, free_memory, place

CLASSES = ["a100-80g", "l4-24g", "a100-mig-3g.40gb"]
MODELS = ["m1", "m2", "m3"]


def card(index: int, device_class: str, free: int, unavailable: bool) -> Device:
    return Device(
        "nvidia", index, device_class, 81920, free, device_class=device_class,
        unavailable="no MIG instance carved" if unavailable else "",
    )  # fmt: skip


nodes_strategy = st.lists(
    st.lists(
        st.tuples(st.sampled_from(CLASSES), st.integers(0, 8).map(lambda n: n * 10240), st.booleans()),
        min_size=0,
        max_size=4,
    ),
    min_size=1,
    max_size=5,
)


def inventory(n: int, cards: list[tuple[str, int, bool]], memory_mb: int = 65536) -> NodeInventory:
    devices = tuple(card(i, c, free, off and i == 0) for i, (c, free, off) in enumerate(cards))
    return NodeInventory(f"n{n}", "127.0.0.1", 8, memory_mb, devices)


@dataclass
class World:
    """What the index is told, kept as a full scan sees it."""

    nodes: dict[str, NodeInventory] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    placed: list[Placed] = field(default_factory=list)

    def listed(self) -> list[NodeInventory]:
        return [self.nodes[node_id] for node_id in self.order if node_id in self.nodes]


change = st.one_of(
    st.tuples(
        st.just("add"),
        st.integers(0, 4),
        st.sampled_from(MODELS),
        st.integers(1, 8).map(lambda g: g * 5120),
        st.lists(st.integers(0, 3), max_size=2, unique=True),
    ),
    st.tuples(st.just("remove"), st.integers(0, 50)),
    st.tuples(st.just("leave"), st.integers(0, 4)),
    st.tuples(st.just("join"), st.integers(0, 4), st.integers(1, 8).map(lambda g: g * 8192)),
)


@settings(max_examples=150, deadline=None)
@given(shapes=nodes_strategy, changes=st.lists(change, max_size=25), asks=st.lists(
    st.tuples(st.sampled_from(MODELS), st.integers(1, 16).map(lambda g: g * 5120), st.integers(1, 3),
              st.sampled_from([None, *CLASSES])), min_size=1, max_size=4))  # fmt: skip
def test_the_index_agrees_with_a_full_scan_after_any_changes(
    shapes: list[list[tuple[str, int, bool]]],
    changes: list[tuple[object, ...]],
    asks: list[tuple[str, int, int, str | None]],
) -> None:
    world = World()
    for n, cards in enumerate(shapes):
        node = inventory(n, cards)
        world.nodes[node.node_id] = node
        world.order.append(node.node_id)
    index = FreeCards(world.listed())
    serial = 0
    for step in changes:
        match step:
            case ("add", int(n), str(model), int(memory), list(devices)) if f"n{n}" in world.order:
                serial += 1
                replica = Placed(model, f"n{n}", memory, tuple(devices), replica_id=f"r{serial}")
                world.placed.append(replica)
                index.add(replica)
            case ("remove", int(which)) if world.placed:
                gone = world.placed.pop(which % len(world.placed))
                index.remove(gone.replica_id)
            case ("leave", int(n)) if f"n{n}" in world.nodes:
                del world.nodes[f"n{n}"]
                index.node_left(f"n{n}")
            case ("join", int(n), int(memory)) if f"n{n}" in world.order:
                node = inventory(n, shapes[n], memory)
                world.nodes[node.node_id] = node
                index.node_joined(node)
    for node in world.listed():
        assert index.free(node.node_id) == (
            free_gpu_memory(node, world.placed),
            free_memory(node, world.placed),
        )
    for model, memory, tp, gpu_class in asks:
        spread = Spread(tp=tp)
        found = index.best(model, memory, spread, gpu_class=gpu_class)
        full = place(model, memory, world.listed(), world.placed, spread, gpu_class=gpu_class)
        if found is not None:
            assert (found.node_id, found.devices) == (full.node_id, full.devices)
            assert set(found.refusals) <= {NOT_LOOKED_AT}
        else:  # none: no node without a replica of the model has the cards
            assert (
                not full.placed
                or not full.devices
                or any(p.node_id == full.node_id and p.model == model for p in world.placed)
            )


def test_a_node_running_the_model_is_passed_over_for_one_that_does_not() -> None:
    big = inventory(0, [("a100-80g", 81920, False)] * 2)
    small = inventory(1, [("a100-80g", 40960, False)])
    index = FreeCards([big, small], [Placed("m1", "n0", 10240, (0,), replica_id="r1")])
    found = index.best("m1", 20480)
    assert found is not None and (found.node_id, found.devices) == ("n1", (0,))
    assert found.refusals == {
        NOT_LOOKED_AT: "1 node(s) not weighed one by one: n1 has the most memory on its card "
        "among the nodes without a replica of m1"
    }
    assert index.best("m1", 51200) is None  # only n0 has the room, and it runs m1: weigh every node
