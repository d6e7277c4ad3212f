"""The local channel between a control plane and its gateway workers, over a real Unix socket: a full
copy on connect, the changes after it, requests and limit counts back, reconnection with a new copy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.controlplane.statesharing.gatewaystate import GatewayState
from llmgw.controlplane.statesharing.localchannel import (
    SOCKET_NAME,
    WorkerChannelServer,
    WorkerFollowing,
    WorkerLoads,
)
from llmgw.controlplane.statesharing.stateevents import InFlight, Request, UsageSummed, Used, Wanted
from llmgw.core.backoff import Backoff
from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry, ReplicaEndpoint, hash_secret
from llmgw.gateway.queueing import QueueState
from llmgw.gateway.usage import UsageRecord
from llmgw.testing.eventually import eventually


def key(key_id: str, secret: str) -> KeyEntry:
    return KeyEntry(key_id, key_id, hash_secret(secret), "ann", Place(Owner.parse("project:acme/ml/chat")))


def endpoint(replica_id: str) -> ReplicaEndpoint:
    return ReplicaEndpoint(replica_id, "m", f"http://127.0.0.1:1/{replica_id}", "rk", 2, "vllm")


class Main:
    """The control plane's side: its gateway, its state, the channel server and what workers asked."""

    def __init__(self, path: Path) -> None:
        self.gateway = Gateway()
        self.state = GatewayState(self.gateway.feed)
        self.requests: list[Request] = []
        self.serving = True
        self.server = WorkerChannelServer(
            self.state, self.gateway.limiter, self.requests.append, serves=lambda: self.serving
        )
        self.path = path
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.ensure_future(self.server.run(self.path))

    async def stop(self) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class Worker:
    def __init__(self, path: Path) -> None:
        self.gateway = Gateway()
        self.gateway.limiter.share = 0.5
        self.answered = 0
        self.queued: dict[str, QueueState] = {}
        self.told_elsewhere: list[dict[str, int]] = []
        self.following = WorkerFollowing(
            GatewayState(self.gateway.feed),
            self.gateway.limiter,
            path,
            models=self.gateway.replicas.models,
            metrics=lambda: [["llmgw_gateway_requests_total", {}, float(self.answered)]],
            queued=lambda: self.queued,
            elsewhere=lambda flows: self.told_elsewhere.append(dict(flows)),
        )
        self.task = asyncio.ensure_future(self.following.run(Backoff(base=0.01, cap=0.05)))


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Main, Worker]]:
    main = Main(tmp_path / SOCKET_NAME)
    main.gateway.feed.keys_replaced([key("k1", "sk-1"), key("k2", "sk-2")])
    main.gateway.feed.replica_ready(endpoint("r1"))
    main.start()
    worker = Worker(tmp_path / SOCKET_NAME)
    try:
        yield main, worker
    finally:
        worker.task.cancel()
        await main.stop()
        await asyncio.gather(worker.task, return_exceptions=True)
        await main.gateway.close()
        await worker.gateway.close()


async def test_a_worker_gets_a_full_copy_through_a_socket_only_its_user_opens(
    pair: tuple[Main, Worker], tmp_path: Path
) -> None:
    main, worker = pair
    await eventually(lambda: worker.following.serves, timeout_s=5)
    assert worker.gateway.keys.lookup("sk-1") == key("k1", "sk-1")
    assert [e.replica_id for e in worker.gateway.replicas.ready("m")] == ["r1"]
    assert stat.S_IMODE((tmp_path / SOCKET_NAME).stat().st_mode) == 0o600
    await eventually(lambda: set(main.server.pids.values()) == {os.getpid()})  # it says who it is
    main.serving = False  # e.g. a standby without a leader's copy: the worker hands /v1 on
    await eventually(lambda: not worker.following.serves, timeout_s=2)


async def test_a_key_revoked_on_the_control_plane_is_gone_from_the_worker_within_a_second(
    pair: tuple[Main, Worker],
) -> None:
    main, worker = pair
    await eventually(lambda: worker.following.connected, timeout_s=5)
    main.gateway.feed.keys_replaced([key("k2", "sk-2")])
    main.gateway.feed.replica_gone("r1")
    await eventually(lambda: worker.gateway.keys.lookup("sk-1") is None, timeout_s=1.0)
    assert worker.gateway.keys.lookup("sk-2") is not None
    assert worker.gateway.replicas.ready("m") == []


async def test_requests_and_limit_counts_go_back_and_the_totals_come_to_every_worker(
    pair: tuple[Main, Worker],
) -> None:
    main, worker = pair
    limits = {"project:acme/ml/chat": Limits(tokens_per_day=1000, requests_per_minute=60)}
    main.gateway.feed.limits_replaced(limits)
    await eventually(lambda: worker.gateway.limiter.meter("project:acme/ml/chat") is not None, timeout_s=5)
    meter = worker.gateway.limiter.meter("project:acme/ml/chat")
    assert meter is not None and meter.requests is not None and meter.requests.capacity == 30  # its share
    assert meter.day_cap == 1000  # budgets are held whole, against the cluster's count
    ticket = worker.gateway.limiter.admit(key("k1", "sk-1"), "m")
    assert ticket is not None
    ticket.spend(40)
    worker.following.request(Wanted("m"))
    await eventually(lambda: main.requests == [Wanted("m")], timeout_s=2)
    main_meter = main.gateway.limiter.meter("project:acme/ml/chat")
    assert main_meter is not None
    await eventually(lambda: main_meter.day_used == 40 and main_meter.unsaved == 40, timeout_s=3)
    main_meter.day_used += 100  # what another worker reported
    await eventually(lambda: meter.day_used == 140, timeout_s=3)


async def test_a_worker_keeps_its_copy_and_requests_while_the_channel_is_down_then_takes_a_new_copy(
    pair: tuple[Main, Worker],
) -> None:
    main, worker = pair
    await eventually(lambda: worker.following.connected, timeout_s=5)
    await main.stop()
    await eventually(lambda: not worker.following.connected, timeout_s=2)
    assert worker.gateway.keys.lookup("sk-1") is not None  # still serving from its copy
    worker.following.request(Used("m"))
    main.gateway.feed.keys_replaced([key("k3", "sk-3")])
    main.gateway.feed.replica_gone("r1")
    main.start()
    await eventually(lambda: worker.following.connections == 2 and worker.following.connected, timeout_s=5)
    assert worker.gateway.keys.lookup("sk-1") is None
    assert worker.gateway.keys.lookup("sk-3") is not None
    assert worker.gateway.replicas.ready("m") == []  # the copy named no replica: the old one forgotten
    await eventually(lambda: Used("m") in main.requests, timeout_s=2)


async def test_the_control_plane_sees_the_requests_a_worker_has_in_flight(pair: tuple[Main, Worker]) -> None:
    main, worker = pair
    await eventually(lambda: worker.gateway.replicas.get("r1") is not None, timeout_s=5)
    loads = main.server.loads
    replica = worker.gateway.replicas.get("r1")
    assert replica is not None
    with worker.gateway.replicas.acquire(replica):
        await eventually(
            lambda: loads.replica_in_flight("r1") == 1 and loads.in_flight("m") == 1, timeout_s=2
        )
    await eventually(lambda: loads.replica_in_flight("r1") == 0 and loads.in_flight("m") == 0, timeout_s=2)


async def test_the_control_plane_sees_who_waits_in_a_workers_flow_queue(pair: tuple[Main, Worker]) -> None:
    main, worker = pair
    worker.queued = {"m": QueueState(3, {"project:acme/ml/chat": 3})}
    await eventually(lambda: main.server.loads.queues() == worker.queued, timeout_s=2)
    await eventually(
        lambda: worker.told_elsewhere == [{}], timeout_s=2
    )  # a queue of its own: told of others'
    worker.queued = {"m": QueueState(0, {}, 1.5)}  # drained: the latest wait stays
    await eventually(lambda: main.server.loads.queues() == worker.queued, timeout_s=2)


def test_a_worker_with_a_queue_hears_of_the_flows_waiting_in_the_others() -> None:
    loads = WorkerLoads()
    loads.report(1, InFlight({}, {}, {"m": {"project:a": 2}, "n": {"": 1}}))
    loads.report(2, InFlight({}, {}, {"m": {"project:a": 1, "project:b": 5}}))
    loads.report(3, InFlight({"m": 1}, {}))  # no queue (or the release before queues): told nothing
    assert loads.flows_elsewhere(1) == {"m": 2}
    assert loads.flows_elsewhere(2) == {"m": 1, "n": 1}
    assert loads.flows_elsewhere(3) is None and loads.flows_elsewhere(4) is None
    assert (loads.waiting("m"), loads.waiting("n"), loads.waiting("o")) == (8, 1, 0)


async def test_a_scrape_gets_each_workers_samples_as_of_now(pair: tuple[Main, Worker]) -> None:
    main, worker = pair
    await eventually(lambda: main.server.connected == 1 and worker.following.connected, timeout_s=5)
    worker.answered = 7
    assert await main.server.fresh_metrics(timeout_s=0.5) == [[["llmgw_gateway_requests_total", {}, 7.0]]]
    worker.answered = 9  # asked again: no waiting for the next second's samples
    assert await main.server.fresh_metrics(timeout_s=0.5) == [[["llmgw_gateway_requests_total", {}, 9.0]]]


async def test_a_workers_usage_goes_back_summed_a_line_per_tick_and_waits_while_the_channel_is_down(
    pair: tuple[Main, Worker],
) -> None:
    main, worker = pair
    await eventually(lambda: worker.following.connected, timeout_s=5)
    for status in (200, 200, 429):
        worker.following.usage(UsageRecord("k1", "m", "r1", 5, 2, status, 0.25, place="project:1"))

    def sums() -> list[list[Any]]:
        return [row for r in main.requests if isinstance(r, UsageSummed) for row in r.rows()]

    await eventually(
        lambda: sums() == [["k1", "m", "project:1", 3, 1, 15, 6, 0.75, 0, 0.0, 0.0, 0, 0, 0.0]], timeout_s=2
    )
    assert [r.kind for r in main.requests] == ["usage_sums"]  # one line for the three requests
    await main.stop()
    await eventually(lambda: not worker.following.connected, timeout_s=2)
    worker.following.usage(UsageRecord("k2", "m", "r1", 1, 0, 200, 0.5))
    main.start()
    await eventually(lambda: len(sums()) == 2, timeout_s=5)
    assert sums()[1] == ["k2", "m", "", 1, 0, 1, 0, 0.5, 0, 0.0, 0.0, 0, 0, 0.0]


async def test_models_kept_in_use_go_back_once_per_model_and_tick(pair: tuple[Main, Worker]) -> None:
    main, worker = pair
    await eventually(lambda: worker.following.connected, timeout_s=5)
    for _ in range(100):  # every request's end says its model is in use
        worker.following.used("m")
    worker.following.used("lm")
    await eventually(lambda: len(main.requests) == 2, timeout_s=2)
    assert main.requests == [Used("lm"), Used("m")]


async def test_a_worker_of_the_previous_release_is_served_the_same_lines(
    pair: tuple[Main, Worker], tmp_path: Path
) -> None:
    """Workers left serving across the plane's own restart run the code they started with: the lines stay
    those of the release before versions were stated (one JSON object each, read without ``v``)."""
    main, _ = pair
    reader, writer = await asyncio.open_unix_connection(str(tmp_path / SOCKET_NAME))
    try:
        writer.write(b'{"kind":"hello","pid":4242}\n{"kind":"wanted","model":"m"}\n')
        kinds = []
        while "serves" not in kinds:
            line = await asyncio.wait_for(reader.readline(), 5)
            event = json.loads(line)
            assert isinstance(event, dict) and line.endswith(b"\n")
            kinds.append(event["kind"])
        assert kinds[0] == "copy" and kinds[-2:] == ["live", "serves"]
        assert "replica_ready" in kinds and "keys_replaced" in kinds
        await eventually(lambda: 4242 in main.server.pids.values() and Wanted("m") in main.requests)
    finally:
        writer.close()
