"""How many replicas a model wants now: its demand, the load the gateway sees, and autoscaling.

A model's floor is ``replicas.min`` (or, on demand, one while requests want it and none once it has
been idle past ``idle_timeout_s``); between that floor and ``replicas.max`` the count follows the
gateway's view of its load (:mod:`llmgw.core.scaling`, with its cool-downs). An environment's members
count as its entry: their requests keep it wanted, and their load is added to its own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from llmgw.controlplane.nodes.fleet import ReplicaState
from llmgw.core.catalog import ModelDefinition
from llmgw.core.scaling import ModelLoad, ScalingHistory, ScalingPolicy, decide_scale
from llmgw.core.shards import ReplicaPhase

log = logging.getLogger(__name__)


class ReplicaCount:
    """Each model's wanted count of replicas, and the last scaling decision in words."""

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        in_flight: Callable[[str], int],
        load: Callable[[str], ModelLoad],
        last_used: dict[str, float],
    ) -> None:
        self._clock = clock
        self._in_flight = in_flight
        self._load = load
        """The gateway's view of a model's load (autoscaling's input)."""
        self._last_used = last_used
        """Model -> when a request last wanted or used it (:class:`.demand.ModelDemand`)."""
        self.members: dict[str, tuple[str, ...]] = {}
        """Each environment entry's members, whose demand and load count as the entry's."""
        self._history: dict[str, ScalingHistory] = {}
        self.scaling: dict[str, str] = {}
        """Each model's last scaling decision, in words."""

    def demanded(self, model: ModelDefinition) -> bool:
        """Whether a request wants ``model`` now or used it within its idle timeout."""
        names = (model.name, *self.members.get(model.name, ()))  # an environment's members count as it
        if sum(self._in_flight(name) for name in names) > 0:
            self._last_used[model.name] = self._clock()
            return True
        used = [at for name in names if (at := self._last_used.get(name)) is not None]
        return bool(used) and self._clock() - max(used) < model.idle_timeout_s

    def model_load(self, name: str) -> ModelLoad:
        """The gateway's view of ``name``'s load, an environment's members' requests added to its entry's."""
        load = self._load(name)
        for member in self.members.get(name, ()):
            theirs = self._load(member)
            load = dataclasses.replace(
                load, running=load.running + theirs.running, waiting=load.waiting + theirs.waiting
            )
        return load

    def scale(self, model: ModelDefinition, floor: int, mine: list[ReplicaState]) -> int:
        """The count autoscaling keeps for ``model`` now (at least ``floor``), logged when it changes."""
        policy = ScalingPolicy(
            min=floor,
            max=max(floor, model.replicas.max),
            ttft_target_ms=model.replicas.ttft_target_ms,
            up_cooldown_s=model.replicas.scale_up_cooldown_s,
            down_cooldown_s=model.replicas.scale_down_cooldown_s,
        )
        starting = sum(1 for r in mine if r.state is not ReplicaPhase.READY)
        decision = decide_scale(
            policy,
            len(mine),
            self.model_load(model.name),
            self._history.get(model.name, ScalingHistory()),
            self._clock(),
            starting=starting,
        )
        self._history[model.name] = decision.history
        self.scaling[model.name] = decision.reason
        if decision.replicas != len(mine) and mine:
            log.info("scaling %s: %s", model.name, decision.reason)
        return decision.replicas
