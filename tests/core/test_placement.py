"""Placement: which node and card a new replica goes to, and why not elsewhere."""

from __future__ import annotations

from llmgw.core.devices import Device, NodeInventory
from llmgw.core.mig import Spread
from llmgw.core.placement import Ask, Placed, ShardPlace, place, place_nodes, place_profiles


def card(index: int, free_mb: int, total_mb: int = 24576) -> Device:
    return Device(kind="nvidia", index=index, name="NVIDIA L4", memory_mb=total_mb, memory_free_mb=free_mb)


def node(node_id: str, memory_mb: int, *cards: Device) -> NodeInventory:
    cpu = Device(kind="cpu", index=0, name="CPU", memory_mb=memory_mb, memory_free_mb=memory_mb)
    return NodeInventory(
        node_id=node_id, address=f"{node_id}.lan", cpu_cores=8, memory_mb=memory_mb, devices=(cpu, *cards)
    )


def test_the_node_with_room_is_picked() -> None:
    decision = place("m", 4000, [node("small", 2000), node("big", 8000)], [])

    assert (decision.placed, decision.node_id, decision.devices) == (True, "big", ())
    assert decision.refusals["small"] == "needs 4000 MiB; 2000 MiB of host memory left"


def test_among_nodes_with_room_the_one_with_most_memory_left_is_picked() -> None:
    decision = place("m", 1000, [node("a", 4000), node("b", 16000), node("c", 8000)], [])

    assert decision.node_id == "b"
    assert set(decision.refusals) == {"a", "c"}


def test_replicas_of_one_model_spread_over_nodes() -> None:
    nodes = [node("busy", 64000), node("quiet", 8000)]
    placed = [Placed("m", "busy", 1000)]

    assert place("m", 1000, nodes, placed).node_id == "quiet"


def test_replicas_of_other_models_do_not_count_against_spreading() -> None:
    nodes = [node("busy", 64000), node("quiet", 8000)]
    placed = [Placed("other", "busy", 1000)]

    assert place("m", 1000, nodes, placed).node_id == "busy"


def test_a_card_with_enough_free_memory_is_preferred_to_host_memory() -> None:
    decision = place("m", 4000, [node("n", 64000, card(0, 8000))], [])

    assert (decision.node_id, decision.devices) == ("n", (0,))


def test_the_card_with_most_free_memory_is_picked() -> None:
    decision = place("m", 4000, [node("n", 64000, card(0, 6000), card(1, 20000), card(2, 10000))], [])

    assert decision.devices == (1,)


def test_host_memory_is_used_when_no_card_has_room() -> None:
    decision = place("m", 12000, [node("n", 64000, card(0, 8000))], [])

    assert (decision.node_id, decision.devices) == ("n", ())


def test_a_node_whose_card_fits_is_preferred_to_a_node_with_only_host_memory() -> None:
    decision = place("m", 4000, [node("cpu-only", 256000), node("gpu", 16000, card(0, 8000))], [])

    assert (decision.node_id, decision.devices) == ("gpu", (0,))


def test_spreading_comes_before_a_free_card() -> None:
    nodes = [node("gpu", 16000, card(0, 8000)), node("cpu-only", 16000)]
    placed = [Placed("m", "gpu", 4000, devices=(0,))]

    assert place("m", 2000, nodes, placed).node_id == "cpu-only"


def test_a_node_passed_over_is_told_it_fits() -> None:
    decision = place("m", 1000, [node("a", 4000), node("b", 16000)], [])

    assert decision.refusals["a"].startswith("fits, but another node has")


def test_when_nothing_fits_each_node_is_refused_naming_its_memory() -> None:
    nodes = [node("cpu", 2000), node("gpu", 3000, card(0, 1000), card(1, 2500))]

    decision = place("m", 4000, nodes, [])

    assert not decision.placed
    assert (decision.node_id, decision.devices) == ("", ())
    assert decision.refusals == {
        "cpu": "needs 4000 MiB; 2000 MiB of host memory left",
        "gpu": "needs 4000 MiB; 3000 MiB of host memory left, at most 2500 MiB on a card",
    }


def test_with_no_nodes_nothing_is_placed_and_nothing_refused() -> None:
    decision = place("m", 1000, [], [])

    assert (decision.placed, decision.refusals) == (False, {})


def test_replicas_in_host_memory_reduce_a_nodes_free_memory() -> None:
    nodes = [node("a", 8000), node("b", 6000)]
    placed = [Placed("other", "a", 5000), Placed("another", "a", 1000)]

    decision = place("m", 4000, nodes, placed)

    assert decision.node_id == "b"
    assert decision.refusals["a"] == "needs 4000 MiB; 2000 MiB of host memory left"


def test_replicas_on_a_card_reduce_that_cards_free_memory_only() -> None:
    nodes = [node("n", 1000, card(0, 10000), card(1, 8000))]
    placed = [Placed("other", "n", 6000, devices=(0,))]

    decision = place("m", 5000, nodes, placed)

    assert decision.devices == (1,)


def test_a_replica_over_several_cards_takes_an_equal_share_of_each() -> None:
    nodes = [node("n", 1000, card(0, 8000), card(1, 8000))]
    placed = [Placed("other", "n", 10000, devices=(0, 1))]

    decision = place("m", 4000, nodes, placed)

    assert not decision.placed
    assert (
        decision.refusals["n"] == "needs 4000 MiB; 1000 MiB of host memory left, at most 3000 MiB on a card"
    )


def test_replicas_on_other_nodes_leave_a_nodes_memory_alone() -> None:
    nodes = [node("n", 4000, card(0, 4000))]
    placed = [Placed("other", "elsewhere", 4000), Placed("other", "elsewhere", 4000, devices=(0,))]

    decision = place("m", 4000, nodes, placed)

    assert (decision.node_id, decision.devices) == ("n", (0,))


def mig(card_index: int, instance: int, free_mb: int, profile: str = "3g.40gb") -> Device:
    return Device(
        kind="nvidia",
        index=1000 + 100 * card_index + instance,
        name=f"NVIDIA A100-SXM4-80GB MIG {profile}",
        memory_mb=free_mb,
        memory_free_mb=free_mb,
        device_class=f"a100-80g-mig-{profile}",
        mig_profile=profile,
    )


def test_a_replica_goes_on_a_mig_instance_by_its_number() -> None:
    decision = place("m", 30000, [node("n", 1000, mig(0, 0, 40192), mig(0, 1, 19968))], [])

    assert (decision.node_id, decision.devices) == ("n", (1000,))


def test_a_mig_card_with_nothing_carved_is_never_picked_and_the_reason_is_given() -> None:
    empty = Device(
        kind="nvidia",
        index=0,
        name="NVIDIA A100-SXM4-80GB",
        memory_mb=81920,
        memory_free_mb=81920,
        device_class="a100-80g",
        unavailable="MIG mode is on and no instance is carved",
    )

    decision = place("m", 4000, [node("n", 1000, empty)], [])

    assert not decision.placed
    assert "card 0: MIG mode is on and no instance is carved" in decision.refusals["n"]


def test_a_replica_spread_over_several_devices_is_refused_on_mig_instances() -> None:
    decision = place("m", 4000, [node("n", 1000, mig(1, 0, 40192))], [], Spread(tp=2))

    assert not decision.placed
    assert "device 1/mig0" in decision.refusals["n"] and "tp 2" in decision.refusals["n"]


def test_a_spread_replica_still_goes_on_whole_cards() -> None:
    decision = place(
        "m", 4000, [node("n", 1000, mig(0, 0, 40192), card(1, 24000), card(2, 24000))], [], Spread(tp=2)
    )

    assert decision.devices == (1, 2)


def _gpu_node(node_id: str, *cards: tuple[str, int]) -> NodeInventory:
    devices = tuple(
        Device(kind="nvidia", index=i, name=cls, memory_mb=mem, memory_free_mb=mem, device_class=cls)
        for i, (cls, mem) in enumerate(cards)
    )
    return NodeInventory(node_id=node_id, address="127.0.0.1", cpu_cores=8, memory_mb=65536, devices=devices)


def test_tensor_parallel_takes_that_many_cards_on_one_node() -> None:
    node = _gpu_node("n1", ("h100-80g", 81920), ("h100-80g", 81920), ("h100-80g", 40000))
    decision = place("m", 120000, [node], [], Spread(tp=2))
    assert decision.node_id == "n1" and decision.devices == (0, 1)


def test_gpu_class_counts_only_cards_of_that_class_and_never_host_memory() -> None:
    mixed = _gpu_node("mixed", ("a100-80g", 81920), ("h100-80g", 81920))
    cpu_only = NodeInventory(node_id="cpu", address="127.0.0.1", cpu_cores=8, memory_mb=10**6)
    decision = place("m", 1000, [mixed, cpu_only], [], gpu_class="h100-80g")
    assert (decision.node_id, decision.devices) == ("mixed", (1,))
    refused = place("m", 1000, [cpu_only], [], gpu_class="h100-80g")
    assert not refused.placed
    assert refused.refusals["cpu"] == "needs 1 card of class h100-80g with 1000 MiB free each; 0 there"


def test_profiles_are_tried_in_order_on_every_node_first() -> None:
    """Profile 1 (a card) is tried on both nodes before profile 2 (host memory) on any."""
    l4 = Device(kind="nvidia", index=0, name="NVIDIA L4", memory_mb=24576, memory_free_mb=20000,
                device_class="l4-24g")  # fmt: skip
    nodes = [node("cpu-only", 64000), node("gpu", 8000, l4)]
    asks = [Ask(16000, gpu_class="l4-24g"), Ask(16000)]
    decision = place_profiles("m", asks, nodes, [])
    assert (decision.node_id, decision.devices, decision.profile) == ("gpu", (0,), 0)
    full = [Placed("other", "gpu", 16000, (0,))]
    second = place_profiles("m", asks, nodes, full)
    assert (second.node_id, second.profile) == ("cpu-only", 1)
    assert second.refusals["gpu"].startswith("profile 1: needs 1 card of class l4-24g")
    assert "; profile 2: needs 16000 MiB; 8000 MiB of host memory left" in second.refusals["gpu"]


def test_one_profile_keeps_its_reasons_unprefixed() -> None:
    decision = place_profiles("m", [Ask(4000)], [node("small", 2000)], [])
    assert decision.refusals == {"small": "needs 4000 MiB; 2000 MiB of host memory left"}


def test_a_pipeline_parallel_profile_takes_tp_x_pp_cards_of_one_node() -> None:
    nodes = [
        node("two", 64000, card(0, 20000), card(1, 20000)),
        node("four", 64000, *(card(i, 20000) for i in range(4))),
    ]
    decision = place_profiles("m", [Ask(32000, Spread(tp=2, pp=2, gpus=4))], nodes, [])
    assert (decision.node_id, decision.devices, decision.more) == ("four", (0, 1, 2, 3), ())
    assert decision.refusals["two"] == "needs 4 cards with 8000 MiB free each; 2 there"


def l4_node(node_id: str, *free_mb: int) -> NodeInventory:
    return node(node_id, 64000, *(card(i, free) for i, free in enumerate(free_mb)))


def test_a_two_node_replica_takes_one_shard_on_each_of_two_nodes_the_roomiest_first() -> None:
    nodes = [l4_node("a", 8000, 8000), l4_node("b", 20000, 20000), l4_node("c", 16000, 16000)]
    decision = place_profiles("m", [Ask(40000, Spread(tp=2, pp=2, gpus=2, nodes=2))], nodes, [])
    assert (decision.node_id, decision.devices) == ("b", (0, 1))
    assert decision.more == (ShardPlace("c", (0, 1)),)
    assert decision.refusals == {"a": "needs 2 cards with 10000 MiB free each; 0 there"}


def test_a_node_fitting_a_shard_but_not_taken_says_which_nodes_were() -> None:
    nodes = [l4_node("a", 20000), l4_node("b", 20000), l4_node("c", 20000)]
    placed = [Placed("m", "a", 1000, (0,))]
    decision = place_nodes("m", 20000, nodes, placed, Spread(tp=2, gpus=1, nodes=2))
    assert {decision.node_id, decision.more[0].node_id} == {"b", "c"}
    assert decision.refusals["a"].startswith("fits one shard (10000 MiB on 1 card), but ")
    assert decision.refusals["a"].endswith("were taken: fewer replicas of this model, more room")


def test_too_few_nodes_with_room_turns_every_set_down_with_each_nodes_reason() -> None:
    nodes = [l4_node("a", 20000), l4_node("b", 4000), node("cpu", 512000)]
    decision = place_nodes("m", 20000, nodes, [], Spread(tp=2, gpus=1, nodes=2))
    assert not decision.placed and decision.more == ()
    assert decision.refusals == {
        "a": "fits one shard (10000 MiB on 1 card), but a replica spans 2 nodes and only 1 has the room",
        "b": "needs 1 card with 10000 MiB free each; 0 there",
        # host memory never serves a multi-node replica
        "cpu": "needs 1 card with 10000 MiB free each; 0 there",
    }


def test_a_multi_node_profile_falls_back_to_the_next_with_both_reasons() -> None:
    nodes = [l4_node("a", 20000), l4_node("b", 20000)]
    asks = [Ask(60000, Spread(tp=2, gpus=1, nodes=2)), Ask(1000)]
    decision = place_profiles("m", asks, nodes, [])
    assert decision.profile == 1 and decision.more == ()
    refused = "a" if decision.node_id == "b" else "b"
    assert decision.refusals[refused].startswith("profile 1: needs 1 card with 30000 MiB free each; 0 there")


def test_a_multi_node_replica_is_never_placed_on_mig_instances() -> None:
    mig = Device(kind="nvidia", index=1000, name="MIG 3g.40gb", memory_mb=40000, memory_free_mb=40000,
                 device_class="a100-80g-mig-3g.40gb")  # fmt: skip
    nodes = [node("a", 64000, mig), node("b", 64000, mig)]
    decision = place_nodes("m", 20000, nodes, [], Spread(tp=2, gpus=1, nodes=2))
    assert not decision.placed
    assert "device 0/mig0: " in decision.refusals["a"]
