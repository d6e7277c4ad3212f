"""What the gateway tells reaches the leader's parts: through the follower, as requests it dispatches."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.controlplane.gateway_outbound import FollowerOutbound
from llmgw.controlplane.statestream import request_dispatcher
from llmgw.gateway import UsageRecord
from llmgw.gateway.outbound import GatewayOutbound


class Follower:
    """Hands requests to the leader's dispatcher at once, as a leading plane's follower does."""

    def __init__(self) -> None:
        self.told: list[tuple[str, Any]] = []
        self.dispatch = request_dispatcher(
            lambda record: self.told.append(("usage", record)),
            lambda model: self.told.append(("wanted", model)),
            lambda model: self.told.append(("used", model)),
            lambda replica_id, reason: self.told.append(("failed", (replica_id, reason))),
            lambda tokens, plane: None,
        )

    def request(self, request: dict[str, Any]) -> None:
        self.dispatch(request)

    def usage(self, record: UsageRecord) -> None:
        self.told.append(("usage", record))

    def used(self, model: str) -> None:
        self.told.append(("used", model))


def test_each_thing_the_gateway_tells_reaches_the_leaders_part_for_it() -> None:
    follower = Follower()
    outbound = FollowerOutbound()
    told: GatewayOutbound = outbound
    outbound.bind(follower)
    record = UsageRecord("k1", "m", "r1", 1, 2, 200, 0.1)
    told.replica_wanted("m")
    told.model_used("m")
    told.usage(record)
    told.replica_failed("r1", "connection refused")
    assert follower.told == [
        ("wanted", "m"),
        ("used", "m"),
        ("usage", record),
        ("failed", ("r1", "connection refused")),
    ]


def test_what_is_told_before_the_follower_exists_is_dropped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outbound = FollowerOutbound()
    outbound.replica_wanted("m")
    outbound.model_used("m")
    assert "before its follower was built" in caplog.text
