"""Rolling a model's replicas onto its adapters when its engine loads them only at start.

llama.cpp (``--lora``) and vLLM without ``max_loaded_adapters`` are given a
model's LoRA adapters on their command line: a replica started before an
adapter was added to its model (a published training job, or any change of
the definition's adapters in the store) does not hold it, and the gateway sends a request
naming the adapter only to a replica that does (``gateway/adapters.py``). Such
a replica is *stale*: the adapters it was started with differ from the
model's. The reconciler replaces stale replicas one at a time, surge first, so
the model keeps serving throughout:

1. with as many replicas as it wants and no fresh one starting, it places one
   more, started with every adapter of the model (never evicting anything for
   it: when no node has room beside the others, it drains a stale one instead
   and places its replacement once it is gone);
2. once no fresh replica is starting, it drains a stale one (the one least
   worth keeping: failed before starting before ready), which then stops when
   its requests are done;

and again until none is stale. Autoscaling does not count the extra replica
(the reconciler remembers it until an old one drains in its place, and keeps
it in the store: a new leader goes on with the same extra replica, waiting
until every replica's adapters are known again, :mod:`.underway`), so a roll
ends with the count it began with, through a failover too. A replica's adapters are the ones its node was
sent when it was last started (:class:`ReplicaState.adapters`); a replica a
control plane took over before it was sent anything counts the adapters its
agent reported as ready. Restarting a failed replica starts it with the
model's adapters as they are.

A replica whose engine loads adapters at run time (vLLM with
``max_loaded_adapters``) is never stale: when its model's adapters change its
node is sent the replica's start again, which a running shard takes as its
adapters to fetch (:func:`runtime_behind`), and the gateway loads them from
the paths the agent then reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.controlplane.nodes.fleet import ReplicaState
from llmgw.controlplane.replicas.shardspecs import profile_of
from llmgw.core.catalog import ModelDefinition
from llmgw.core.shards import ReplicaPhase


def loads_adapters_at_start(model: ModelDefinition, replica: ReplicaState) -> bool:
    """Whether ``replica``'s engine is given ``model``'s adapters only on its command line."""
    return not profile_of(model, replica.profile).max_loaded_adapters


def runtime_behind(model: ModelDefinition, replica: ReplicaState) -> bool:
    """Whether ``replica``'s engine loads adapters at run time and its node was last sent other
    adapters than ``model`` has now: the node is sent them (fetching their files), not rolled."""
    if replica.adapters is None or loads_adapters_at_start(model, replica):
        return False
    return set(replica.adapters) != {adapter.name for adapter in model.adapters}


def stale(model: ModelDefinition, replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
    """The replicas among ``replicas`` started with other adapters than ``model`` has now
    (its engine loading them only at start); those whose adapters are not known yet are not."""
    wanted = {adapter.name for adapter in model.adapters}
    found = []
    for replica in replicas:
        if replica.adapters is None or not loads_adapters_at_start(model, replica):
            continue
        if set(replica.adapters) != wanted:
            found.append(replica)
    return found


def unknown(replicas: Sequence[ReplicaState]) -> bool:
    """Whether the adapters of any of ``replicas`` are not known yet (taken over from another
    control plane, its agent has not reported it ready, nor has it been started since)."""
    return any(replica.adapters is None for replica in replicas)


@dataclass(frozen=True)
class RollStep:
    """What one reconciler pass does for a model with stale replicas."""

    surge: bool = False
    """Place one more replica (with every adapter) beside the others."""
    drain: tuple[ReplicaState, ...] = ()
    """Stale replicas to drain now."""


def roll_step(mine: Sequence[ReplicaState], old: Sequence[ReplicaState], want: int) -> RollStep:
    """The next step of rolling ``old`` (stale, among ``mine``: the model's replicas not draining)
    when the model wants ``want`` replicas; nothing while a fresh replica is still starting."""
    starting = any(r.state is not ReplicaPhase.READY for r in mine if r not in old)
    surplus = len(mine) - want
    if starting or surplus < 0:  # wait for it; too few: the reconciler places fresh ones as ever
        return RollStep()
    if not surplus:
        return RollStep(surge=True)
    return RollStep(drain=tuple(sorted(old, key=lambda r: r.state.worth)[:surplus]))


def why_drained(model: ModelDefinition, replica: ReplicaState) -> str:
    """The drain reason a stale replica is given, naming the adapters it lacks or no longer serves."""
    wanted = [adapter.name for adapter in model.adapters]
    held = set(replica.adapters or ())
    missing = [name for name in wanted if name not in held]
    extra = sorted(held - set(wanted))
    said = []
    if missing:
        said.append(f"started without adapter(s) {', '.join(missing)}")
    if extra:
        said.append(f"started with removed adapter(s) {', '.join(extra)}")
    return "; ".join(said) + "; a replica started with the model's adapters replaces it"
