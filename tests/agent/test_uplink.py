"""The agent's uplink: what its parts send goes to the session once it runs, and keeps going there."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from llmgw.agent.running import Uplink
from llmgw.agent.session import AgentSession
from llmgw.agent.supervising import ShardSupervisor
from llmgw.core.shards import FetchProgress
from llmgw.testing.eventually import eventually


def _message(text: str) -> Any:
    """A message as the session takes it (the uplink looks at none)."""
    return text


class _Session:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.control_planes = ["cp1:8443", "cp2:8443"]
        self.running = asyncio.Event()

    def send(self, message: Any) -> None:
        self.sent.append(message)

    async def run(self) -> None:
        self.running.set()
        await asyncio.Event().wait()


class _Shards:
    def __init__(self) -> None:
        self.progress: list[tuple[str, FetchProgress]] = []

    def fetching(self, replica_id: str, progress: FetchProgress) -> None:
        self.progress.append((replica_id, progress))


async def test_the_uplink_drops_until_the_session_runs_then_hands_everything_to_it_even_between_runs() -> (
    None
):
    uplink = Uplink(["cp1:8443"])
    session, shards = _Session(), _Shards()
    uplink.send(_message("before"))
    assert uplink.control_planes() == ["cp1:8443"]
    running = asyncio.create_task(uplink.run(cast(AgentSession, session), cast(ShardSupervisor, shards)))
    await eventually(session.running.is_set)
    uplink.send(_message("telemetry"))
    progress = FetchProgress(done=1, total=2, bytes_per_s=1.0)
    uplink.fetching("r1", progress)
    assert session.sent == ["telemetry"] and shards.progress == [("r1", progress)]
    assert uplink.control_planes() == ["cp1:8443", "cp2:8443"]  # those the session learnt
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    uplink.send(_message("while the session waits to run again"))
    assert session.sent[-1] == "while the session waits to run again"
    assert uplink.control_planes() == ["cp1:8443", "cp2:8443"]
