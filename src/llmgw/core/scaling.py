"""Autoscaling: how many replicas a model keeps between ``replicas.min`` and ``max``, and why.

The reconciler asks :func:`decide_scale` once a pass for each model, with what
the gateway sees of the model's load now (:class:`ModelLoad`), what the last
decisions left behind (:class:`ScalingHistory`) and the clock. The answer is
the count to keep, the reason in words and the history for next time.

- **Up** by one replica when requests wait (beyond every ready replica's
  slots, or for a replica at all), when the running requests fill
  :data:`BUSY_SHARE` of the slots, or when the recent time to first token is
  above ``ttft_target_ms``; never while a replica added before is still
  starting, and not again within ``up_cooldown_s`` of the last change.
- **Down** by one when the requests running would fit in one replica fewer at
  :data:`CALM_SHARE` of its slots, nothing waits and the time to first token is
  below half its target, and this has held without a break for
  ``down_cooldown_s`` (and that long since the last change).

The gap between the two thresholds, and the calm that has to last a whole
cool-down, is what keeps oscillating load from flapping the count: load that
comes back before the cool-down ends starts the calm over.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

BUSY_SHARE = 0.9
"""Share of the ready replicas' slots in use at which one more replica is added."""
CALM_SHARE = 0.5
"""Share of one replica fewer's slots the running requests must fit in before one is drained."""


@dataclass(frozen=True)
class ModelLoad:
    """What the gateway sees of one model's load now."""

    ready: int = 0
    """Ready replicas the gateway routes to."""
    slots: int = 0
    """Requests those replicas serve at once, together."""
    running: int = 0
    """Requests on them (at most ``slots``)."""
    waiting: int = 0
    """Requests queued beyond the slots, and requests waiting for a replica to be ready."""
    ttft_ms: float | None = None
    """Mean time to first token of the recent streamed answers; None without any."""


@dataclass(frozen=True)
class ScalingPolicy:
    """A model's bounds and pace (``replicas`` in the catalog)."""

    min: int
    """The floor: ``replicas.min`` (1 while an on-demand model is in use)."""
    max: int
    ttft_target_ms: int | None = None
    up_cooldown_s: float = 30.0
    down_cooldown_s: float = 300.0


@dataclass(frozen=True)
class ScalingHistory:
    """What the previous decisions of one model leave for the next."""

    changed_at: float | None = None
    """When the count last went up or down (the clock's seconds); None: never."""
    calm_since: float | None = None
    """Since when the load has been low enough to drop a replica, without a break; None: it is not."""


@dataclass(frozen=True)
class ScaleDecision:
    """The count to keep, why, and the history the next decision starts from."""

    replicas: int
    reason: str
    history: ScalingHistory


def decide_scale(
    policy: ScalingPolicy,
    current: int,
    load: ModelLoad,
    history: ScalingHistory,
    now: float,
    *,
    starting: int = 0,
) -> ScaleDecision:
    """How many replicas to keep, given ``current`` (``starting`` of them not ready yet)."""
    floor, ceiling = max(0, policy.min), max(policy.min, policy.max)
    if current < floor:
        return ScaleDecision(floor, f"up from {current} to {floor}: replicas.min is {floor}", _changed(now))
    if current > ceiling:
        return ScaleDecision(ceiling, f"down from {current} to {ceiling}: replicas.max is {ceiling}",
                             _changed(now))  # fmt: skip
    since_change = float("inf") if history.changed_at is None else now - history.changed_at
    pressure = _pressure(policy, load)
    if pressure:
        history = replace(history, calm_since=None)
        if current >= ceiling:
            return ScaleDecision(current, f"{pressure}, but already at replicas.max ({ceiling})", history)
        if starting:
            return ScaleDecision(current, f"{pressure}; waiting for {starting} replica(s) starting", history)
        if since_change < policy.up_cooldown_s:
            left = policy.up_cooldown_s - since_change
            return ScaleDecision(current, f"{pressure}; scale-up cool-down, {left:.0f} s left", history)
        return ScaleDecision(current + 1, f"up from {current} to {current + 1}: {pressure}", _changed(now))
    calm = _calm(policy, current, load)
    if not calm:
        return ScaleDecision(current, "load within range", replace(history, calm_since=None))
    calm_since = history.calm_since if history.calm_since is not None else now
    history = replace(history, calm_since=calm_since)
    if current <= floor:
        return ScaleDecision(current, f"{calm}; at replicas.min ({floor})", history)
    calm_for = now - calm_since
    wait = max(policy.down_cooldown_s - calm_for, policy.down_cooldown_s - since_change)
    if wait > 0:
        return ScaleDecision(current, f"{calm} for {calm_for:.0f} s; scale-down cool-down, {wait:.0f} s left",
                             history)  # fmt: skip
    return ScaleDecision(
        current - 1, f"down from {current} to {current - 1}: {calm} for {calm_for:.0f} s", _changed(now)
    )


def _changed(now: float) -> ScalingHistory:
    return ScalingHistory(changed_at=now, calm_since=None)


def _pressure(policy: ScalingPolicy, load: ModelLoad) -> str:
    """Why the model needs one more replica, in words; empty when it does not."""
    if load.waiting > 0:
        return f"{load.waiting} request(s) waiting"
    if load.slots and load.running >= BUSY_SHARE * load.slots:
        return f"{load.running} of {load.slots} slots busy"
    target = policy.ttft_target_ms
    if target and load.ttft_ms is not None and load.ttft_ms > target:
        return f"time to first token {load.ttft_ms:.0f} ms, above the {target} ms target"
    return ""


def _calm(policy: ScalingPolicy, current: int, load: ModelLoad) -> str:
    """Why one replica fewer would do, in words; empty when it would not."""
    if load.ready == 0 or load.waiting > 0 or current < 1:
        return ""
    target = policy.ttft_target_ms
    if target and load.ttft_ms is not None and load.ttft_ms > target / 2:
        return ""
    per_replica = load.slots / load.ready
    room = CALM_SHARE * per_replica * (current - 1)
    if load.running > room:
        return ""
    return f"{load.running} request(s) running fit in {current - 1} replica(s)"


class TtftWindow:
    """Times to first token of the last ``window_s`` seconds, per model (the clock passed in)."""

    def __init__(self, window_s: float = 60.0, most: int = 1000) -> None:
        self.window_s = window_s
        self._most = most
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def add(self, model: str, now: float, ttft_ms: float) -> None:
        samples = self._samples.setdefault(model, deque(maxlen=self._most))
        samples.append((now, ttft_ms))

    def mean(self, model: str, now: float) -> float | None:
        """The mean of the model's samples in the window; None without any."""
        samples = self._samples.get(model)
        if not samples:
            return None
        while samples and now - samples[0][0] > self.window_s:
            samples.popleft()
        if not samples:
            return None
        return sum(ms for _, ms in samples) / len(samples)
