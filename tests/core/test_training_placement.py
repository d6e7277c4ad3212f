"""Training placement: a card with the room, nothing foreign, no replica on it; one job per node."""

from __future__ import annotations

from llmgw.core.devices import Device, NodeInventory
from llmgw.core.mig import Spread
from llmgw.core.placement import Ask, Placed, place_profiles
from llmgw.core.trainingplacement import TrainingAsk, TrainingHold, TrainingNode, place_training, withheld


def card(index: int, free: int, total: int = 24000, unavailable: str = "") -> Device:
    return Device("nvidia", index, "NVIDIA L4", total, free, device_class="l4", unavailable=unavailable)


def node(node_id: str, *cards: Device, memory_mb: int = 32000, **extra: object) -> TrainingNode:
    return TrainingNode(NodeInventory(node_id, "10.0.0.1", 8, memory_mb, cards), **extra)  # type: ignore[arg-type]


def test_a_card_with_the_room_is_taken_and_every_other_card_says_why_not() -> None:
    nodes = [
        node("a", card(0, 24000), card(1, 4000), card(2, 24000), foreign={2: ("python3",)}),
        node("b", card(0, 24000), card(1, 0, unavailable="MIG with nothing carved")),
        node("c", card(0, 20000)),
    ]
    placed = [Placed("chat", "b", 20000, (0,)), Placed("cpu-model", "c", 1000)]
    decision = place_training(TrainingAsk("j", 8000), nodes, placed)
    assert (decision.node_id, decision.device) == ("a", "0")
    assert decision.refusals["b"] == ("card 0: a replica of chat holds it; card 1: MIG with nothing carved")
    assert decision.refusals["c"] == "fits, but another node has more room"
    only_b = place_training(TrainingAsk("j", 8000), nodes[1:2], placed)
    assert not only_b.placed and only_b.reasons.startswith("b: card 0: a replica of chat")


def test_too_little_memory_a_foreign_process_and_a_busy_node_are_named() -> None:
    nodes = [
        node("a", card(0, 4000), card(1, 24000), foreign={1: ("ollama", "pid 77")}),
        node("b", card(0, 24000), training="tj_0123456789ab"),
        node("c"),
    ]
    decision = place_training(TrainingAsk("j", 8000), nodes, [])
    assert not decision.placed
    assert decision.refusals == {
        "a": "card 0: 4000 MiB free, the job needs 8000; "
        "card 1: a process that is not llmgw's runs on it (ollama, pid 77)",
        "b": "trains job tj_0123456789ab; a node trains one job at a time",
        "c": "has no card",
    }


def test_a_cpu_job_needs_the_host_memory_left_and_a_named_node_is_kept_to() -> None:
    nodes = [node("a", memory_mb=4000), node("b", memory_mb=64000)]
    held = [Placed("m", "b", 60000)]
    decision = place_training(TrainingAsk("j", 8000, "cpu"), nodes, held)
    assert decision.refusals == {
        "a": "needs 8000 MiB of host memory; 4000 MiB left",
        "b": "needs 8000 MiB of host memory; 4000 MiB left",
    }
    fits = place_training(TrainingAsk("j", 2000, "cpu", node="b"), nodes, held)
    assert (fits.node_id, fits.device, fits.refusals) == ("b", "cpu", {"a": "the job asks for node b"})
    gone = place_training(TrainingAsk("j", 2000, "cpu", node="z"), nodes, held)
    assert gone.refusals["z"] == "not connected" and not gone.placed


def test_no_node_at_all_says_so() -> None:
    assert place_training(TrainingAsk("j", 1), [], []).reasons == "no node is connected"


def test_replica_placement_leaves_a_training_card_alone_and_says_which_job_holds_it() -> None:
    nodes = [NodeInventory("n1", "10.0.0.1", 8, 2000, (card(0, 24000), card(1, 24000)))]
    holds = [TrainingHold("tj_0123456789ab", "n1", "0", 8000)]
    both = place_profiles("chat", [Ask(16000, Spread(gpus=2))], withheld(nodes, holds), [])
    assert not both.placed
    assert both.refusals["n1"] == (
        "needs 2 cards with 8000 MiB free each; 1 there; card 0: training job tj_0123456789ab trains on it"
    )
    one = place_profiles("chat", [Ask(16000)], withheld(nodes, holds), [])
    assert (one.node_id, one.devices) == ("n1", (1,))
    free = place_profiles("chat", [Ask(16000, Spread(gpus=2))], withheld(nodes, []), [])
    assert free.devices == (0, 1)  # the cards are the replicas' again once the job is done


def test_a_cpu_job_takes_its_memory_from_the_host_memory_replicas_see() -> None:
    nodes = [NodeInventory("n1", "10.0.0.1", 8, 6000), NodeInventory("n2", "10.0.0.2", 8, 3000)]
    holds = [TrainingHold("tj_0123456789ab", "n1", "cpu", 4000)]
    seen = withheld(nodes, holds)
    assert [n.memory_mb for n in seen] == [2000, 3000]
    decision = place_profiles("small", [Ask(2500)], seen, [])
    assert decision.node_id == "n2"
    assert decision.refusals["n1"] == "needs 2500 MiB; 2000 MiB of host memory left"
