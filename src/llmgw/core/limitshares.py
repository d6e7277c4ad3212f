"""How the control planes serving /v1 divide every rate and concurrency limit between them.

Each plane enforces a *share* of each per-minute rate and concurrency limit
(:attr:`~llmgw.core.limits.Meter.share`; a gateway worker then holds its
part of its plane's share), so that the shares of one subject sum to one and
the cluster as a whole admits the limit, not N times it. Day and month
budgets are not divided: every plane counts against the cluster's total.

The leader divides (:func:`divide`): a subject no plane used lately is split
evenly; a subject used is split by recent use, each plane keeping a floor
(:data:`FLOOR` of an even split) so that traffic moving to a plane is
admitted there at once, up to the floor, until the next division follows
it. With the floor the division converges: when every plane is refused
(all want more than their share), admitted use follows the shares, which
move towards the even split by ``1 - FLOOR`` each time.

:class:`PlaneShares` is what the leader sends every plane (over the gateway
state stream): each plane picks its own (:meth:`PlaneShares.of`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

FLOOR = 0.2
"""The part of an even split every serving plane keeps of every subject, used or not."""
MOVE = 0.05
"""A division whose shares all moved by less than this is not sent again (fewer changes streamed)."""


@dataclass(frozen=True)
class PlaneShares:
    """Each serving plane's share of every limited subject."""

    planes: tuple[str, ...] = ()
    """The planes serving /v1 (the leader and the standbys following it), sorted."""
    subjects: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per plane, the subjects divided by use; every other subject is split evenly."""

    def even(self) -> float:
        return 1.0 / max(1, len(self.planes))

    def of(self, plane: str) -> tuple[float, dict[str, float]]:
        """``plane``'s share of a subject not listed, and of those listed. A plane not (yet) among
        the serving ones holds what one more plane would: it is about to be counted in."""
        if plane not in self.planes:
            return 1.0 / (len(self.planes) + 1), {}
        return self.even(), dict(self.subjects.get(plane, {}))

    def as_dict(self) -> dict[str, Any]:
        return {"planes": list(self.planes), "subjects": {p: dict(s) for p, s in self.subjects.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlaneShares:
        subjects = {str(p): {str(s): float(v) for s, v in by.items()} for p, by in data["subjects"].items()}
        return cls(tuple(str(p) for p in data["planes"]), subjects)

    def close_to(self, other: PlaneShares) -> bool:
        """Same planes, and no share of any subject moved by :data:`MOVE` or more."""
        if self.planes != other.planes:
            return False
        even = self.even()
        for plane in self.planes:
            mine, theirs = self.subjects.get(plane, {}), other.subjects.get(plane, {})
            for subject in mine.keys() | theirs.keys():
                if abs(mine.get(subject, even) - theirs.get(subject, even)) >= MOVE:
                    return False
        return True


def divide(
    planes: Iterable[str], use: Mapping[str, Mapping[str, float]], floor: float = FLOOR
) -> PlaneShares:
    """The shares of ``planes`` given each one's recent ``use`` (plane -> subject -> amount)."""
    serving = tuple(sorted(set(planes)))
    n = len(serving)
    if n == 0:
        return PlaneShares()
    totals: dict[str, float] = {}
    for plane in serving:
        for subject, amount in use.get(plane, {}).items():
            if amount > 0:
                totals[subject] = totals.get(subject, 0.0) + amount
    subjects: dict[str, dict[str, float]] = {plane: {} for plane in serving}
    if n > 1:
        for subject, total in totals.items():
            for plane in serving:
                amount = max(0.0, use.get(plane, {}).get(subject, 0.0))
                # The fraction first: (1 - floor) * amount rounds up when amount is subnormal.
                part = min(1.0, amount / total)
                subjects[plane][subject] = floor / n + (1.0 - floor) * part
    return PlaneShares(serving, {p: by for p, by in subjects.items() if by})
