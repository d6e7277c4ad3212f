"""The leader divides the limits between the planes serving /v1: on joining and leaving, and by use."""

from __future__ import annotations

import pytest

from llmgw.controlplane.accounting.limit_sharing import DECAY, LimitSharing
from llmgw.core.limits import Limits
from llmgw.core.limitshares import FLOOR, PlaneShares
from llmgw.gateway import Gateway

KEY = "key:k1"


class Leader:
    def __init__(self) -> None:
        self.gateway = Gateway()
        self.gateway.limiter.plane = "cp1"
        self.gateway.feed.limits_replaced({KEY: Limits(requests_per_minute=100)})
        self.told: list[PlaneShares] = []
        self.gateway.feed.listen(
            lambda change, args: self.told.append(args[0]) if change == "limits_shared" else None
        )
        self.leading = True
        self.sharing = LimitSharing("cp1", self.gateway.feed, lambda: self.leading)

    def share(self) -> float:
        meter = self.gateway.limiter.meter(KEY)
        assert meter is not None
        return meter.share


def test_a_standby_joining_halves_the_leaders_share_and_leaving_gives_it_back() -> None:
    leader = Leader()
    leader.sharing.divide()
    assert leader.share() == 1.0
    leader.sharing.joined("cp2")
    assert leader.share() == 0.5 and leader.told[-1].planes == ("cp1", "cp2")
    leader.sharing.joined("cp2")  # reconnected before its old stream ended
    leader.sharing.left("cp2")
    assert leader.share() == 0.5
    leader.sharing.left("cp2")
    assert leader.share() == 1.0 and leader.told[-1].planes == ("cp1",)


def test_shares_follow_use_and_even_out_once_it_is_forgotten() -> None:
    leader = Leader()
    leader.sharing.joined("cp2")
    leader.sharing.used("cp2", {KEY: 300})
    leader.sharing.used("cp1", {KEY: 100})
    leader.sharing.tick()
    assert leader.share() == pytest.approx(FLOOR / 2 + (1 - FLOOR) * 0.25)
    sent = len(leader.told)
    leader.sharing.used("cp1", {KEY: 1})  # a move under MOVE is not streamed again
    leader.sharing.tick()
    assert len(leader.told) == sent
    for _ in range(40):  # no more use: DECAY forgets it
        leader.sharing.tick()
    assert 0 < DECAY < 1 and leader.share() == 0.5


def test_a_plane_naming_nothing_weighs_nothing_and_a_standby_divides_nothing() -> None:
    leader = Leader()
    leader.sharing.joined("cp2")
    leader.sharing.used("", {KEY: 1000})
    leader.sharing.tick()
    assert leader.share() == 0.5
    leader.leading = False
    told = len(leader.told)
    leader.sharing.joined("cp3")
    leader.sharing.tick()
    assert len(leader.told) == told and leader.share() == 0.5
    leader.leading = True
    leader.sharing.tick()  # leading again: divides afresh
    assert leader.share() == pytest.approx(1 / 3)
