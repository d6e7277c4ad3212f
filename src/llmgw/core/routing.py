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
    engine_load: int = 0
    """Requests the engine itself last reported running or waiting (every router's, not only ours)."""
    readable: bool = True
    """False while the engine's metrics cannot be read: the router sends it nothing (never blind)."""

    @property
    def utilisation(self) -> float:
        return max(self.in_flight, self.engine_load) / max(1, self.capacity)


def least_loaded(replicas: Sequence[ReplicaLoad], turn: int = 0) -> ReplicaLoad | None:
    """The readable replica with the lowest share of its capacity in use; ``turn`` breaks ties in rotation."""
    replicas = [r for r in replicas if r.readable]
    if not replicas:
        return None
    lowest = min(r.utilisation for r in replicas)
    tied = [r for r in replicas if r.utilisation == lowest]
    return tied[turn % len(tied)]
