"""Eviction: which lower-priority replicas to drain so that a replica that fits nowhere fits somewhere.

Asked only when no profile of the model fits on any node as things are
(:func:`~llmgw.core.placement.place_profiles`). On each node, for each profile
in order, the replicas that may go are those of models with a lower
``priority`` that are not siblings of the one asked for: never a replica of the
same model, never one serving the same environment. They are taken lowest
priority first (the larger first among equals) until the replica would fit on
that node, then any that turn out not to be needed are given back. Replicas
already draining there that it could have evicted count as gone, so a pass that
runs while an eviction drains asks for nothing more; a draining replica it could
not have evicted (its own, one of higher priority) still holds its room, which
keeps a model from waiting on room that was freed for another. The earliest profile wins, then the fewest
replicas evicted, then the lowest priority among them.
"""

from __future__ import annotations

from dataclasses import replace

from llmgw.core.devices import NodeInventory
from llmgw.core.placement import Ask, Decision, Placed, place


def plan_eviction(
    model: str,
    priority: int,
    asks: list[Ask],
    nodes: list[NodeInventory],
    placed: list[Placed],
    unplaced: Decision,
    *,
    environment: str = "",
) -> Decision:
    """``unplaced`` (the decision that found no room) with the eviction that would make room, if any.

    The answer's ``kept`` says, for every replica looked at and not evicted, why.
    """
    kept: dict[str, str] = {}
    best: tuple[tuple[int, int, int], Decision] | None = None
    for index, ask in enumerate(asks):
        if ask.spread.nodes > 1:
            continue
        for node in nodes:
            here = [p for p in placed if p.node_id == node.node_id]
            candidates, going = [], []
            for p in here:
                why = _kept(p, model, priority, environment)
                if why:
                    kept[p.replica_id] = why
                elif p.draining:
                    kept[p.replica_id] = "already draining"
                    going.append(p)
                else:
                    candidates.append(p)
            draining = tuple(p.replica_id for p in going)
            victims = _victims(model, ask, node, placed, candidates, going)
            if victims is None or not (victims or draining):
                continue
            key = (index, len(victims), max((p.priority for p in victims), default=priority))
            if best is None or key < best[0]:
                found = Decision(
                    refusals=unplaced.refusals,
                    profile=index,
                    evict_node=node.node_id,
                    evict=tuple(p.replica_id for p in victims),
                    waiting_for=draining,
                )
                best = (key, found)
    if best is None:
        return replace(unplaced, kept=kept)
    chosen = best[1]
    for p in placed:
        if p.replica_id in chosen.evict or p.replica_id in kept:
            continue
        if p.node_id == chosen.evict_node:
            kept[p.replica_id] = "not needed: the replicas evicted free enough"
        else:
            kept[p.replica_id] = f"on {p.node_id}; evicting on {chosen.evict_node} frees enough with as few"
    for replica_id in chosen.evict:
        kept.pop(replica_id, None)
    return replace(chosen, kept=kept)


def _kept(p: Placed, model: str, priority: int, environment: str) -> str:
    """Why ``p`` may not be evicted for a replica of ``model``; empty when it may."""
    if p.model == model:
        return "a replica of the same model: siblings never evict each other"
    if environment and p.environment == environment:
        return f"serves environment {environment}, as the replica asked for does"
    if p.priority >= priority:
        return f"priority {p.priority}, not below {priority}"
    return ""


def _victims(
    model: str,
    ask: Ask,
    node: NodeInventory,
    placed: list[Placed],
    candidates: list[Placed],
    going: list[Placed],
) -> list[Placed] | None:
    """The fewest of ``candidates`` whose going (with ``going``'s) lets ``ask`` fit on ``node``;
    None when not even all of them would do."""
    gone_already = {p.replica_id for p in going}

    def fits(gone: list[Placed]) -> bool:
        ids = gone_already | {p.replica_id for p in gone}
        others = [p for p in placed if not (p.node_id == node.node_id and p.replica_id in ids)]
        return place(model, ask.memory_mb, [node], others, ask.spread, gpu_class=ask.gpu_class).placed

    if fits([]):
        return []
    victims: list[Placed] = []
    for p in sorted(candidates, key=lambda p: (p.priority, -p.memory_mb)):
        victims.append(p)
        if fits(victims):
            break
    else:
        return None
    for p in reversed(victims[:-1]):
        fewer = [v for v in victims if v is not p]
        if fits(fewer):
            victims = fewer
    return victims
