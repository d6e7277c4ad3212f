"""The flow queue: priority first, weighted fair between flows, bounded with shedding, in time."""

from __future__ import annotations

from collections import Counter

import pytest

from llmgw.core.flowqueue import FlowQueue, Waiting

LATER = 1e9


def _drain(queue: FlowQueue) -> list[Waiting]:
    sent = []
    while (waiting := queue.next()) is not None:
        sent.append(waiting)
    return sent


def test_a_flood_gets_its_share_and_no_more() -> None:
    queue = FlowQueue(capacity=2000)
    for _ in range(1000):
        queue.offer("flood", deadline=LATER)
    for _ in range(10):
        queue.offer("chat", deadline=LATER)
    first_twenty = [w.flow for w in _drain(queue)[:20]]
    assert Counter(first_twenty) == {"flood": 10, "chat": 10}


def test_a_flow_that_waited_none_starts_level_and_not_with_credit() -> None:
    queue = FlowQueue(capacity=100)
    for _ in range(6):
        queue.offer("a", deadline=LATER)
    for _ in range(3):
        assert queue.next() is not None  # a's first three are sent; virtual time moves on
    for _ in range(3):
        queue.offer("b", deadline=LATER)
    assert [w.flow for w in _drain(queue)] == ["a", "b", "a", "b", "a", "b"]


def test_weights_give_a_flow_turns_in_proportion() -> None:
    queue = FlowQueue(capacity=100)
    for _ in range(30):
        queue.offer("heavy", deadline=LATER, weight=2.0)
        queue.offer("light", deadline=LATER, weight=1.0)
    assert Counter(w.flow for w in _drain(queue)[:30]) == {"heavy": 20, "light": 10}


def test_a_higher_priority_goes_before_every_lower_one() -> None:
    queue = FlowQueue(capacity=100)
    for _ in range(5):
        queue.offer("batch", priority=1, deadline=LATER)
    queue.offer("chat", priority=8, deadline=LATER)
    queue.offer("normal", deadline=LATER)
    assert [w.flow for w in _drain(queue)] == ["chat", "normal"] + ["batch"] * 5


def test_a_full_queue_refuses_a_sheddable_request_at_once() -> None:
    queue = FlowQueue(capacity=2)
    queue.offer("a", deadline=LATER)
    queue.offer("a", deadline=LATER)
    offer = queue.offer("b", sheddable=True, priority=0, deadline=LATER)
    assert offer.outcome == "refused" and offer.waiting is None and len(queue) == 2
    assert "2 requests already wait" in offer.reason and "sheddable" in offer.reason


def test_an_urgent_request_takes_the_place_of_the_newest_sheddable_one() -> None:
    queue = FlowQueue(capacity=3)
    old = queue.offer("batch", sheddable=True, priority=0, deadline=LATER).waiting
    new = queue.offer("batch", sheddable=True, priority=0, deadline=LATER).waiting
    queue.offer("chat", deadline=LATER)
    offer = queue.offer("chat", deadline=LATER)
    assert offer.outcome == "queued" and offer.shed is new and not new.live  # type: ignore[union-attr]
    assert old is not None and old.live and len(queue) == 3
    assert queue.by_flow() == {"batch": 1, "chat": 2}


def test_a_full_queue_of_unsheddable_requests_refuses_the_newcomer() -> None:
    queue = FlowQueue(capacity=1)
    queue.offer("a", deadline=LATER)
    offer = queue.offer("b", deadline=LATER)
    assert offer.outcome == "refused" and offer.shed is None and "none of them is sheddable" in offer.reason


def test_expired_requests_are_taken_out_and_the_rest_keep_their_order() -> None:
    queue = FlowQueue(capacity=10)
    queue.offer("a", deadline=5.0)
    keep = queue.offer("b", deadline=50.0).waiting
    queue.offer("c", deadline=6.0)
    gone = queue.expired(now=10.0)
    assert sorted(w.flow for w in gone) == ["a", "c"] and len(queue) == 1
    assert queue.next() is keep and queue.next() is None


def test_a_request_taken_out_is_never_sent_and_taking_it_again_does_nothing() -> None:
    queue = FlowQueue(capacity=10)
    first = queue.offer("a", deadline=LATER).waiting
    second = queue.offer("a", deadline=LATER).waiting
    assert first is not None and second is not None
    queue.remove(first)
    queue.remove(first)
    assert len(queue) == 1 and queue.next() is second and len(queue) == 0 and queue.by_flow() == {}


def test_a_queue_holds_at_least_one_request() -> None:
    with pytest.raises(ValueError, match="at least one"):
        FlowQueue(capacity=0)


def test_peek_shows_the_next_request_and_leaves_it_waiting() -> None:
    queue = FlowQueue(capacity=10)
    assert queue.peek() is None
    low = queue.offer("a", priority=1, deadline=LATER).waiting
    high = queue.offer("b", priority=7, deadline=LATER).waiting
    assert queue.peek() is high and len(queue) == 2
    queue.remove(high)  # type: ignore[arg-type]
    assert queue.peek() is low and queue.next() is low and queue.peek() is None
