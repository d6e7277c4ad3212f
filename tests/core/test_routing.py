"""Routing: the least loaded ready replica takes the next request, ties in rotation."""

from __future__ import annotations

from llmgw.core.routing import ReplicaLoad, least_loaded, with_affinity


def test_no_replicas_means_no_choice() -> None:
    assert least_loaded([]) is None


def test_the_replica_with_the_lowest_utilisation_is_picked() -> None:
    replicas = [ReplicaLoad("a", in_flight=3, capacity=4), ReplicaLoad("b", in_flight=1, capacity=4)]

    chosen = least_loaded(replicas)

    assert chosen is not None and chosen.replica_id == "b"


def test_utilisation_is_a_share_of_capacity_not_a_count() -> None:
    replicas = [ReplicaLoad("small", in_flight=1, capacity=1), ReplicaLoad("large", in_flight=4, capacity=8)]

    chosen = least_loaded(replicas)

    assert chosen is not None and chosen.replica_id == "large"


def test_ties_are_taken_in_rotation_by_turn() -> None:
    replicas = [
        ReplicaLoad("a", 1, 4),
        ReplicaLoad("busy", 4, 4),
        ReplicaLoad("b", 2, 8),
        ReplicaLoad("c", 1, 4),
    ]

    chosen = [least_loaded(replicas, turn) for turn in range(6)]

    assert [r.replica_id for r in chosen if r is not None] == ["a", "b", "c", "a", "b", "c"]


def test_a_replica_without_capacity_counts_as_serving_one() -> None:
    assert ReplicaLoad("r", in_flight=2, capacity=0).utilisation == 2.0


def test_affinity_wins_until_the_replica_is_saturated() -> None:
    hot = ReplicaLoad("hot", in_flight=1, capacity=2)
    cold = ReplicaLoad("cold", in_flight=0, capacity=2)
    assert with_affinity([cold, hot], {"hot": 0.9}) is hot
    hot.in_flight = 3  # utilisation 1.5: saturated, load balance overrides affinity
    assert with_affinity([cold, hot], {"hot": 0.9}) is cold
    cold.in_flight = 4
    assert with_affinity([cold, hot], {"hot": 0.9}) is hot  # all saturated: least loaded
    hot.readable = False
    cold.readable = False
    assert with_affinity([cold, hot], {"hot": 0.9}) is None


def test_affinity_ties_rotate() -> None:
    loads = [ReplicaLoad("a"), ReplicaLoad("b")]
    assert {with_affinity(loads, {}, turn=t).replica_id for t in range(2)} == {"a", "b"}  # type: ignore[union-attr]
