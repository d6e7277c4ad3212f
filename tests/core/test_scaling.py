"""The autoscaling decision: thresholds, cool-downs, no flapping, the TTFT target."""

from __future__ import annotations

import itertools

from llmgw.core.scaling import ModelLoad, ScalingHistory, ScalingPolicy, TtftWindow, decide_scale

POLICY = ScalingPolicy(min=1, max=3, up_cooldown_s=30, down_cooldown_s=120)
BUSY = ModelLoad(ready=1, slots=4, running=4)
IDLE = ModelLoad(ready=2, slots=8, running=0)


def test_requests_waiting_add_one_replica() -> None:
    decision = decide_scale(POLICY, 1, ModelLoad(ready=1, slots=4, running=4, waiting=3), ScalingHistory(), 0)
    assert decision.replicas == 2
    assert decision.reason == "up from 1 to 2: 3 request(s) waiting"
    assert decision.history.changed_at == 0


def test_busy_slots_add_one_but_not_past_max() -> None:
    assert decide_scale(POLICY, 1, BUSY, ScalingHistory(), 0).replicas == 2
    at_max = decide_scale(POLICY, 3, ModelLoad(ready=3, slots=12, running=12), ScalingHistory(), 0)
    assert at_max.replicas == 3
    assert "already at replicas.max (3)" in at_max.reason


def test_no_second_step_up_within_the_cooldown_nor_while_one_starts() -> None:
    first = decide_scale(POLICY, 1, BUSY, ScalingHistory(), 100)
    assert first.replicas == 2
    starting = decide_scale(POLICY, 2, BUSY, first.history, 200, starting=1)
    assert (starting.replicas, starting.reason) == (2, "4 of 4 slots busy; waiting for 1 replica(s) starting")
    cooling = decide_scale(POLICY, 2, ModelLoad(ready=2, slots=8, running=8), first.history, 110)
    assert cooling.replicas == 2
    assert "scale-up cool-down, 20 s left" in cooling.reason
    assert decide_scale(POLICY, 2, ModelLoad(ready=2, slots=8, running=8), first.history, 130).replicas == 3


def test_down_only_after_calm_lasting_the_whole_cooldown() -> None:
    history = ScalingHistory()
    for now in range(0, 120, 10):
        decision = decide_scale(POLICY, 2, IDLE, history, now)
        assert decision.replicas == 2, decision.reason
        history = decision.history
    assert "scale-down cool-down" in decision.reason
    down = decide_scale(POLICY, 2, IDLE, history, 120)
    assert down.replicas == 1
    assert down.reason == "down from 2 to 1: 0 request(s) running fit in 1 replica(s) for 120 s"


def test_never_below_min() -> None:
    decision = decide_scale(POLICY, 1, ModelLoad(ready=1, slots=4), ScalingHistory(calm_since=0), 10_000)
    assert decision.replicas == 1
    assert "at replicas.min (1)" in decision.reason
    assert decide_scale(ScalingPolicy(min=2, max=3), 1, IDLE, ScalingHistory(), 0).replicas == 2


def test_oscillating_load_does_not_flap() -> None:
    """Load that swings every 20 s between busy and idle: up once, and never down while it swings."""
    history = ScalingHistory()
    current = 1
    counts = []
    for step in range(60):
        now = step * 10
        busy = (step // 2) % 2 == 0
        load = ModelLoad(ready=current, slots=4 * current, running=4 * current if busy else 0)
        decision = decide_scale(POLICY, current, load, history, now)
        current, history = decision.replicas, decision.history
        counts.append(current)
    changes = sum(1 for a, b in itertools.pairwise(counts) if a != b)
    assert changes <= 2  # up to 2 and 3 under the busy spells, and never back down
    assert counts == sorted(counts)


def test_load_between_the_thresholds_keeps_the_count_and_breaks_the_calm() -> None:
    calm = decide_scale(POLICY, 2, IDLE, ScalingHistory(), 0).history
    assert calm.calm_since == 0
    middle = decide_scale(POLICY, 2, ModelLoad(ready=2, slots=8, running=5), calm, 60)
    assert (middle.replicas, middle.reason) == (2, "load within range")
    assert middle.history.calm_since is None


def test_ttft_above_target_scales_up_and_blocks_scale_down() -> None:
    policy = ScalingPolicy(min=1, max=3, ttft_target_ms=500, down_cooldown_s=0)
    slow = ModelLoad(ready=1, slots=4, running=1, ttft_ms=900)
    decision = decide_scale(policy, 1, slow, ScalingHistory(), 0)
    assert decision.replicas == 2
    assert "time to first token 900 ms, above the 500 ms target" in decision.reason
    # quiet, but the first token still takes more than half the target: keep both
    lukewarm = ModelLoad(ready=2, slots=8, running=0, ttft_ms=300)
    assert decide_scale(policy, 2, lukewarm, ScalingHistory(), 1000).replicas == 2
    fast = ModelLoad(ready=2, slots=8, running=0, ttft_ms=100)
    assert decide_scale(policy, 2, fast, ScalingHistory(), 1000).replicas == 1


def test_above_max_goes_down_at_once() -> None:
    decision = decide_scale(POLICY, 5, IDLE, ScalingHistory(changed_at=0), 1)
    assert (decision.replicas, decision.reason) == (3, "down from 5 to 3: replicas.max is 3")


def test_ttft_window_forgets_old_samples() -> None:
    window = TtftWindow(window_s=60)
    assert window.mean("m", 0) is None
    window.add("m", 0, 100)
    window.add("m", 50, 300)
    assert window.mean("m", 55) == 200
    assert window.mean("m", 100) == 300
    assert window.mean("m", 200) is None
