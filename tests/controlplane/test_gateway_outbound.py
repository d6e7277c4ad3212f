"""What the gateway tells reaches the leader's parts: through the outbox and the follower, as requests."""

from __future__ import annotations

import asyncio
from typing import Any

from llmgw.controlplane.serving.gatewaybuilding import Outbox
from llmgw.controlplane.statesharing.stateevents import Request
from llmgw.controlplane.statesharing.statestream import request_dispatcher
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

    def request(self, request: Request) -> None:
        self.dispatch(request)

    def usage(self, record: UsageRecord) -> None:
        self.told.append(("usage", record))

    def used(self, model: str) -> None:
        self.told.append(("used", model))


async def test_what_the_gateway_tells_reaches_the_leaders_parts_in_order_also_what_came_before() -> None:
    follower = Follower()
    outbox = Outbox()
    told: GatewayOutbound = outbox
    record = UsageRecord("k1", "m", "r1", 1, 2, 200, 0.1)
    told.replica_wanted("early")  # before the follower runs: kept
    running = asyncio.create_task(outbox.run(follower))
    await asyncio.sleep(0)
    assert follower.told == [("wanted", "early")]
    told.replica_wanted("m")
    told.model_used("m")
    told.usage(record)
    told.replica_failed("r1", "connection refused")
    assert follower.told == [
        ("wanted", "early"),
        ("wanted", "m"),
        ("used", "m"),
        ("usage", record),
        ("failed", ("r1", "connection refused")),
    ]
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    told.model_used("later")  # the follower gone: kept for the next run, not sent
    assert follower.told[-1] == ("failed", ("r1", "connection refused"))
