"""Routing scores: which ready replica takes the next request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class ReplicaLoad:
    """What the router knows of one replica's load."""

    replica_id: str
    in_flight: int = 0
    """Requests this router has sent and not yet seen end."""
    capacity: int = 1
    """Requests the replica serves at once."""
    others: int = 0
    """Requests on the engine that this router did not send (other control planes', or clients
    going to it directly): what it last reported running or waiting, less this router's in
    flight at that moment. Added to ``in_flight``, never a stale copy of it."""
    readable: bool = True
    """False while the engine's metrics cannot be read: the router sends it nothing (never blind)."""

    @property
    def utilisation(self) -> float:
        return (self.in_flight + self.others) / max(1, self.capacity)


def least_loaded(replicas: Sequence[ReplicaLoad], turn: int = 0) -> ReplicaLoad | None:
    """The readable replica with the lowest share of its capacity in use; ``turn`` breaks ties in rotation."""
    replicas = [r for r in replicas if r.readable]
    if not replicas:
        return None
    lowest = min(r.utilisation for r in replicas)
    tied = [r for r in replicas if r.utilisation == lowest]
    return tied[turn % len(tied)]


def with_affinity(
    replicas: Sequence[ReplicaLoad],
    affinity: dict[str, float],
    turn: int = 0,
    saturation: float = 1.5,
    load_weight: float = 0.5,
) -> ReplicaLoad | None:
    """The replica whose cache helps most, unless it is saturated; load breaks near-ties.

    ``affinity``: per replica, the share (0 to 1) of the prompt it is believed
    to hold. Each readable replica below ``saturation`` (its utilisation:
    requests on it per request it serves at once) scores its affinity less
    ``load_weight`` times its utilisation; the best score wins, ties rotating
    on ``turn``. A saturated replica takes nothing on affinity, so a hot
    prefix never piles onto one replica: when every replica is saturated the
    least loaded takes the request.
    """
    best: list[ReplicaLoad] = []
    best_score = float("-inf")
    share = affinity.get
    for load in replicas:
        if not load.readable:
            continue
        # utilisation, inlined: this loop runs for every replica on every request
        busy = load.in_flight + load.others
        used = busy / (load.capacity if load.capacity > 0 else 1)
        if used >= saturation:
            continue
        score = share(load.replica_id, 0.0) - load_weight * used
        if score > best_score + 1e-9:
            best, best_score = [load], score
        elif score >= best_score - 1e-9:
            best.append(load)
    if not best:
        return least_loaded(replicas, turn)
    return best[turn % len(best)]
