"""A plane's view of its flow queues: its own gateway's and what its workers report, added."""

from __future__ import annotations

from llmgw.gateway.queueing import QueueState, summed


def test_the_workers_waiting_requests_are_added_to_the_planes_own() -> None:
    mine = {"m": QueueState(2, {"project:a": 2}, 0.5)}
    theirs = {"m": QueueState(5, {"project:a": 1, "project:b": 4}, 2.0), "n": QueueState(3, {"": 3}, 0.1)}
    got = summed(mine, theirs)
    assert got == {
        "m": QueueState(7, {"project:a": 3, "project:b": 4}, 0.5),
        "n": QueueState(3, {"": 3}, 0.1),
    }
