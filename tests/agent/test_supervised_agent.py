"""The agent's supervised components: a session or a KV follower that raises is logged, shown in the
agent's health and runs again; a FATAL component ends the agent's run with its error."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.agent.config import ShardSettings
from llmgw.agent.kv_events import BlockChanges, BlockMirror
from llmgw.agent.kv_reporting import KvReporter
from llmgw.agent.session import AgentSession
from llmgw.agent.supervising import ShardSupervisor as Shards
from llmgw.core.devices import NodeInventory
from llmgw.core.health import ComponentState
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.shards import ShardSpec
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import MemoryChannel, memory_pair
from llmgw.runtime.processes import Process, run_process
from llmgw.runtime.supervising import ComponentFailed, Policy, RestartSettings, Supervisor
from llmgw.testing.clock import FakeClock


async def until(condition: Callable[[], bool], turns: int = 2000) -> None:
    """Let the loop run until ``condition`` holds (a bounded number of turns, no wall-clock wait)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


class ConnectFailingOnce:
    """The session's ``connect``: the first call raises a bug (not ChannelClosed), then it connects."""

    def __init__(self) -> None:
        self.calls = 0
        self.controls: list[MemoryChannel[pb.ControlMessage, pb.AgentMessage]] = []

    async def __call__(self, target: str) -> MemoryChannel[pb.AgentMessage, pb.ControlMessage]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("TLS files half written")
        agent, control = memory_pair("node1")
        self.controls.append(control)
        return agent


async def test_a_session_that_raises_is_logged_shown_in_health_and_connects_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def prepare(*args: object) -> None:
        raise AssertionError("no shard is started in this test")

    connect = ConnectFailingOnce()
    session = AgentSession(
        NodeInventory("node1", "127.0.0.1", 4, 8192),
        Shards(tmp_path, ShardSettings(), prepare),  # type: ignore[arg-type]
        ["cp1:8443"],
        connect,
    )
    clock = FakeClock()
    components = Supervisor(clock, RestartSettings(backoff_s=1.0))
    components.add("session", session.run)
    with caplog.at_level(logging.ERROR, logger="llmgw.runtime.supervising"):
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(components.run())
            await until(lambda: components.health()[0].state == ComponentState.RESTARTING)
            [health] = components.health()
            assert (health.restarts, health.last_error) == (1, "RuntimeError: TLS files half written")
            await clock.advance(1.0)
            await until(lambda: connect.calls == 2)
            first = await asyncio.wait_for(connect.controls[0].receive(), 5)
            assert first.WhichOneof("kind") == "register"  # the session runs again
            components.shutdown()
    [logged] = [r for r in caplog.records if "session" in r.getMessage()]
    assert logged.exc_info is not None and logged.exc_info[0] is RuntimeError


@dataclass
class Shard:
    spec: ShardSpec
    kv_events_port: int | None
    kv_replay_port: int | None = None


class FollowerFailingOnce:
    """A KV-events follower factory whose first follower raises; the next ones follow until cancelled."""

    def __init__(self) -> None:
        self.made = 0

    def __call__(
        self,
        endpoint: str,
        on_changes: Callable[[BlockChanges], None],
        *,
        topic: str,
        replay_endpoint: str | None,
    ) -> FollowerFailingOnce.Follower:
        self.made += 1
        return FollowerFailingOnce.Follower(fail=self.made == 1)

    class Follower:
        def __init__(self, fail: bool) -> None:
            self.fail = fail
            self.mirror = BlockMirror()

        async def run(self) -> None:
            if self.fail:
                raise RuntimeError("zmq socket closed under the follower")
            await asyncio.Event().wait()


async def test_a_kv_follower_that_raises_is_logged_shown_in_health_and_followed_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[KvBlocksUpdate] = []
    follow = FollowerFailingOnce()
    clock = FakeClock()
    shards = {"r1": Shard(ShardSpec(replica_id="r1"), kv_events_port=5557)}
    reporter = KvReporter(shards, sent.append, follow=follow, clock=clock)  # type: ignore[arg-type]
    components = Supervisor(clock, RestartSettings(backoff_s=2.0))
    components.add("kv-events", reporter.run)
    with caplog.at_level(logging.ERROR, logger="llmgw.runtime.supervising"):
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(components.run())
            await until(lambda: follow.made == 1)
            await clock.advance(1.0)  # the reporter's next check finds the follower failed
            await until(lambda: components.health()[0].state == ComponentState.RESTARTING)
            assert components.health()[0].last_error == "RuntimeError: zmq socket closed under the follower"
            await clock.advance(2.0)
            await until(lambda: follow.made == 2)
            assert components.health()[0].state == ComponentState.RUNNING
            components.shutdown()
    assert [(b.replica_id, b.reset) for b in sent] == [
        ("r1", True),
        ("r1", True),
    ]  # followed anew, from a reset
    [logged] = [r for r in caplog.records if "kv-events" in r.getMessage()]
    assert logged.exc_info is not None and "replica r1" in "".join(logged.exc_info[1].__notes__)  # type: ignore[union-attr]


async def _nothing(process: Process) -> None:
    return None


async def _until_stopped(parts: None, process: Process) -> None:
    """As the agent's ``serve``: until told to stop."""
    await process.stop.wait()


async def test_a_fatal_component_ends_the_agents_run_with_its_error() -> None:
    async def broken() -> None:
        raise OSError("the work folder is read-only")

    components = Supervisor()
    components.add("config-watch", broken, Policy.FATAL)
    with pytest.raises(ComponentFailed, match="config-watch failed: OSError: the work folder is read-only"):
        await run_process(_nothing, _until_stopped, Process(components), signals=())


async def test_the_agents_components_stop_when_it_is_told_to_stop() -> None:
    stop = asyncio.Event()
    components = Supervisor()
    components.add("session", lambda: asyncio.Event().wait())
    running = asyncio.create_task(
        run_process(_nothing, _until_stopped, Process(components, stop=stop), signals=())
    )
    await until(lambda: components.health()[0].state == ComponentState.RUNNING)
    stop.set()
    await asyncio.wait_for(running, 5)
    assert components.health()[0].state == ComponentState.STOPPED
