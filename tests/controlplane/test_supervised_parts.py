"""The control plane's supervised parts: a failing reconciler is logged, shown in /api/status and runs again;
leader-only work follows leadership; the HTTP server's readiness is an event."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.admin.app import AdminApi
from llmgw.controlplane.config import HttpSettings
from llmgw.controlplane.lifecycle.leaderduties import LeaderDuties
from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.controlplane.serving.httpserving import HttpServer
from llmgw.core.health import ComponentState
from llmgw.errors import ConfigError
from llmgw.gateway.app import Gateway
from llmgw.mirror.blobs import BlobStore
from llmgw.runtime.supervising import Policy, RestartSettings, Supervisor
from llmgw.store import Fence, Leases, Store
from llmgw.testing.clock import FakeClock

TOKEN = "llmgw-admin-test"


async def until(condition: Callable[[], bool], turns: int = 2000) -> None:
    """Let the loop run until ``condition`` holds (a bounded number of turns, no wall-clock wait)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    yield opened
    await opened.close()


def fleet() -> Fleet:
    return Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)


class LeadsAfterOneFailure:
    """``may_act`` for the reconciler: its first call raises (a bug, not a store error), then it leads."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug in the reconciler")
        return True


async def test_a_reconciler_that_raises_is_logged_shown_in_status_and_runs_again(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    supervisor = Supervisor(clock, RestartSettings(backoff_s=2.0))
    the_fleet = fleet()
    reconciler = Reconciler(store, the_fleet, interval_s=3600)
    leads = LeadsAfterOneFailure()
    supervisor.add("reconciler", lambda: reconciler.run(may_act=leads))
    admin = AdminApi(
        name="cp1",
        token_sha256=hashlib.sha256(TOKEN.encode()).hexdigest(),
        store=store,
        fleet=the_fleet,
        reconciler=reconciler,
        blobs=BlobStore(tmp_path / "mirror"),
        on_keys_changed=lambda: asyncio.sleep(0),
        components=supervisor.health,
    )
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=admin.app()),
        base_url="http://cp",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with caplog.at_level(logging.ERROR, logger="llmgw.runtime.supervising"):
        async with client, asyncio.TaskGroup() as tasks:
            tasks.create_task(supervisor.run())
            await until(lambda: supervisor.health()[0].state == ComponentState.RESTARTING)
            [shown] = (await client.get("/api/status")).json()["components"]
            assert shown == {
                "name": "reconciler",
                "state": "restarting",
                "restarts": 1,
                "last_error": "RuntimeError: a bug in the reconciler",
                "last_error_at": clock.time(),
            }
            await clock.advance(2.0)
            await until(lambda: leads.calls == 2)
            assert supervisor.health()[0].state == ComponentState.RUNNING
            supervisor.shutdown()
    [logged] = [r for r in caplog.records if "reconciler" in r.getMessage()]
    assert logged.exc_info is not None and logged.exc_info[0] is RuntimeError


class Agents:
    """The agents' streams, counting what the leader's duties ask of them."""

    def __init__(self) -> None:
        self.let_go_calls = 0
        self.told = 0

    def let_go(self) -> int:
        self.let_go_calls += 1
        return 0

    def tell_planes(self) -> None:
        self.told += 1


async def test_the_reconciler_runs_only_while_leading_and_agents_are_let_go_on_standby(store: Store) -> None:
    leadership = Leadership(Leases(store), Fence("cp1"), Identity("cp1", "cp1:8443", "http://cp1:8080"))
    supervisor = Supervisor()
    runs: list[str] = []

    async def reconciling() -> None:
        runs.append("run")
        await asyncio.Event().wait()

    supervisor.add("reconciler", reconciling, start=False)
    agents = Agents()
    duties = LeaderDuties(leadership, supervisor, agents, ["reconciler"])
    supervisor.add("leader-duties", duties.follow)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(supervisor.run())
        await until(lambda: supervisor.health()[1].state == ComponentState.RUNNING)
        assert not supervisor.running("reconciler")
        await leadership.round()  # takes the lease
        await until(lambda: supervisor.running("reconciler"))
        await leadership.resign()
        await until(lambda: not supervisor.running("reconciler"))
        assert (runs, agents.let_go_calls) == (["run"], 1)
        assert supervisor.health()[0].state == ComponentState.STOPPED
        supervisor.shutdown()


async def test_agents_are_told_when_another_control_plane_joins(store: Store) -> None:
    leadership = Leadership(Leases(store), Fence("cp1"), Identity("cp1", "cp1:8443", "http://cp1:8080"))
    other = Leadership(Leases(store), Fence("cp2"), Identity("cp2", "cp2:8443", "http://cp2:8080"))
    agents = Agents()
    duties = LeaderDuties(leadership, Supervisor(), agents, [])
    await leadership.round()
    await duties.apply()
    await other.round()
    await leadership.round()  # now lists cp2
    await duties.apply()
    assert agents.told == 1


async def test_readiness_is_set_once_the_http_server_listens_and_it_stops_gracefully() -> None:
    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    server = HttpServer(app, HttpSettings(port=0))
    supervisor = Supervisor()
    supervisor.add("http", server.serve_until_stopped, Policy.FATAL)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(supervisor.run())
        await server.listening.wait()
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{server.port}/")
        assert answer.status_code == 204
        await server.stop()
        assert supervisor.health()[0].state == ComponentState.STOPPED
        supervisor.shutdown()


async def test_a_port_that_cannot_be_bound_fails_the_http_component_with_what_to_do() -> None:
    first = HttpServer(Gateway().asgi_app(), HttpSettings(port=0))
    async with asyncio.TaskGroup() as tasks:
        serving = tasks.create_task(first.serve_until_stopped())
        await first.listening.wait()
        second = HttpServer(Gateway().asgi_app(), HttpSettings(port=first.port))
        with pytest.raises(ConfigError, match="cannot serve HTTP") as caught:
            await second.serve_until_stopped()
        assert "free that port" in caught.value.hint and not second.listening.is_set()
        await first.stop()
        await serving
