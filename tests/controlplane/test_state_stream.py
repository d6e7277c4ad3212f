"""The gateway state stream: a standby's gateway follows the leader's (full copy, changes, reconnect,
revocation) and sends back what the leader decides or writes.

Two control planes share one SQLite store (so leadership is real); the stream
between them is the in-memory pair (over gRPC: tests/protocol/test_grpc_state.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.controlplane.accounting.limit_sharing import LimitSharing
from llmgw.controlplane.accounting.usage_writing import UsageWriter
from llmgw.controlplane.lifecycle.leadership import Identity, Leadership
from llmgw.controlplane.serving.relaying import StandbyForwarding
from llmgw.controlplane.statesharing.gatewaystate import (
    OVERFLOW,
    QUEUE_MAX,
    GatewayState,
    apply,
    change_event,
)
from llmgw.controlplane.statesharing.stateevents import (
    Counted,
    InFlight,
    Live,
    ReplicaFailed,
    Request,
    StateChange,
    Usage,
    UsageSummed,
    Used,
    Wanted,
    decode,
    encode,
)
from llmgw.controlplane.statesharing.statestream import (
    RuntimeAdapters,
    StateFollowing,
    StateServing,
    drop_inherited,
    request_dispatcher,
)
from llmgw.core.catalog import ModelDefinition, parse_model
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.limits import Limits
from llmgw.core.limitshares import divide
from llmgw.core.relays import RelayChunk, RelayPeer
from llmgw.core.tenancy import Owner, Place
from llmgw.errors import ChannelClosed, NotLeader, Unauthorized
from llmgw.gateway import Gateway, KeyEntry, ReplicaEndpoint, hash_secret
from llmgw.gateway.feeding import GatewayFeed
from llmgw.gateway.usage import UsageRecord
from llmgw.protocol.channels import StateChannel, memory_state_pair
from llmgw.store import Fence, Leases, Store
from llmgw.store.usage import UsageEntry
from llmgw.testing.eventually import eventually

SHA = "0123456789abcdef" * 4
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def endpoint(replica_id: str, model: str = "m") -> ReplicaEndpoint:
    return ReplicaEndpoint(replica_id, model, f"http://127.0.0.1:1/{replica_id}", "rk", 2, "vllm")


def catalog() -> list[ModelDefinition]:
    model = {"name": "m", "source": {"sha256": SHA}, "adapters": [{"name": "m-sql", "sha256": SHA}]}
    return [parse_model(model)]


def key(key_id: str, secret: str) -> KeyEntry:
    place = Place(Owner.parse("user:ann"), frozenset({Owner.parse("team:acme/ml")}))
    return KeyEntry(key_id, key_id, hash_secret(secret), "ann", place, ("handbook",))


class Plane:
    """One control plane's gateway, the state recorded from its feed and its leadership."""

    def __init__(self, store: Store, name: str) -> None:
        self.gateway = Gateway()
        self.state = GatewayState(self.gateway.feed)
        self.leadership = Leadership(
            Leases(store), Fence(name), Identity(name, f"{name}:8443", f"http://{name}:8080"), lease_s=30
        )
        self.requests: list[Request] = []
        self.serving = StateServing(self.state, self.leadership, self.requests.append)


class Link:
    """The standby's ``connect``: an in-memory stream served by whichever plane ``to`` names."""

    def __init__(self, planes: dict[str, Plane], to: str) -> None:
        self.planes = planes
        self.to = to
        self.streams: list[StateChannel] = []
        self.served: list[asyncio.Task[None]] = []
        self.refused = False

    async def __call__(self, address: str) -> StateChannel:
        if self.refused:
            raise ChannelClosed(f"cannot reach {address}", "retrying")
        mine, theirs = memory_state_pair()
        serving = self.planes[self.to].serving
        self.served.append(asyncio.create_task(serving.serve(RelayPeer("cp2", control_plane=True), theirs)))
        self.streams.append(theirs)
        return mine

    async def break_off(self) -> None:
        """The leader's end goes away (as a killed process's stream ends)."""
        for stream in self.streams:
            await stream.close()


@pytest.fixture
async def planes(tmp_path: Path) -> AsyncIterator[dict[str, Plane]]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    found = {name: Plane(store, name) for name in ("cp1", "cp2", "cp3")}
    for name in ("cp1", "cp2", "cp3", "cp1"):
        await found[name].leadership.round()
    assert found["cp1"].leadership.serving
    yield found
    await store.close()


@contextlib.asynccontextmanager
async def following(planes: dict[str, Plane], link: Link) -> AsyncIterator[StateFollowing]:
    standby = planes["cp2"]
    follower = StateFollowing(standby.state, standby.leadership, link, standby.requests.append)
    task = asyncio.create_task(follower.run())
    try:
        yield follower
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for served in link.served:
            served.cancel()


def fill(feed: GatewayFeed) -> None:
    feed.catalog_replaced(catalog())
    feed.keys_replaced([key("k1", "sk-1"), key("k2", "sk-2")])
    feed.limits_replaced({"key:k1": Limits(requests_per_minute=5, models=frozenset({"m"}))})
    feed.limits_shared(divide(["cp1", "cp2"], {"cp2": {"key:k1": 4.0}}))
    feed.replica_ready(endpoint("r1"), {"m-sql": "/data/sql"})
    feed.replica_ready(endpoint("r2"))
    feed.replica_draining("r2")
    feed.kv_blocks(KvBlocksUpdate(model="m", replica_id="r1", stored=(1, 2, 3), hash_seed="0"))
    feed.kv_blocks(KvBlocksUpdate(model="m", replica_id="r1", removed=(3,)))


def test_every_change_of_the_feed_round_trips_as_an_event_and_a_frame() -> None:
    leader, standby = Gateway(), Gateway()
    told: list[StateChange] = []
    leader.feed.listen(lambda change, args: told.append(change_event(change, args)))
    fill(leader.feed)
    leader.feed.limits_counted({"key:k1": (10, 20)})
    leader.feed.set_stopped(True)
    for event in told:
        read = decode(encode(event))
        assert isinstance(read, type(event))
        apply(read, standby.feed)  # type: ignore[arg-type]
    assert standby.keys.lookup("sk-1") == leader.keys.lookup("sk-1")
    assert standby.replicas.endpoints() == leader.replicas.endpoints()
    assert standby.replicas.router.kv.held("r1") == 2
    assert standby.feed.served_model("m-sql") == "m"
    assert standby.adapters.holds("r1", "m-sql") and not standby.adapters.holds("r2", "m-sql")
    assert standby.feed.stopped
    assert standby.catalog.entries() == leader.catalog.entries()
    assert standby.limiter.limits() == leader.limiter.limits()
    standby.limiter.plane = "cp2"
    apply(change_event("limits_shared", (divide(["cp1", "cp2"], {"cp2": {"key:k1": 4.0}}),)), standby.feed)
    meter = standby.limiter.meter("key:k1")
    assert meter is not None and meter.share == pytest.approx(0.9)  # the floor's 0.1 and all the use


async def test_a_standby_gets_a_full_copy_and_serves_from_it(planes: dict[str, Plane]) -> None:
    fill(planes["cp1"].gateway.feed)
    standby = planes["cp2"].gateway
    async with following(planes, Link(planes, "cp1")) as follower:
        await eventually(lambda: follower.live)
        assert standby.keys.lookup("sk-1") == key("k1", "sk-1")
        assert standby.replicas.get("r1") == endpoint("r1")
        assert standby.replicas.pick("m") == endpoint("r1")  # r2 drains
        assert standby.adapters.holds("r1", "m-sql")  # the adapters each replica's engine was given
        assert standby.replicas.router.kv.held("r1") == 2
        assert "m" in standby.catalog


async def test_changes_on_the_leader_reach_the_standby(planes: dict[str, Plane]) -> None:
    fill(planes["cp1"].gateway.feed)
    leader, standby = planes["cp1"].gateway, planes["cp2"].gateway
    async with following(planes, Link(planes, "cp1")) as follower:
        await eventually(lambda: follower.live)
        leader.feed.replica_ready(endpoint("r3", "other"))
        leader.feed.replica_gone("r1")
        await eventually(lambda: standby.replicas.get("r3") is not None)
        await eventually(lambda: standby.replicas.get("r1") is None)


async def test_a_key_revoked_on_the_leader_is_refused_at_the_standby_within_a_second(
    planes: dict[str, Plane],
) -> None:
    fill(planes["cp1"].gateway.feed)
    standby = planes["cp2"].gateway
    async with following(planes, Link(planes, "cp1")) as follower:
        await eventually(lambda: follower.live)
        planes["cp1"].gateway.feed.keys_replaced([key("k2", "sk-2")])
        await eventually(lambda: standby.keys.lookup("sk-1") is None, timeout_s=1.0)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=standby.asgi_app()), base_url="http://cp2"
        ) as client:
            answer = await client.get("/v1/models", headers={"Authorization": "Bearer sk-1"})
        assert answer.status_code == 401
        assert standby.keys.lookup("sk-2") is not None


async def test_a_standby_keeps_its_copy_when_the_stream_ends_and_takes_a_new_full_copy(
    planes: dict[str, Plane],
) -> None:
    fill(planes["cp1"].gateway.feed)
    link = Link(planes, "cp1")
    standby = planes["cp2"].gateway
    async with following(planes, link) as follower:
        await eventually(lambda: follower.live)
        link.refused = True
        await link.break_off()
        await eventually(lambda: not follower.connected)
        assert follower.live  # it keeps routing with what it has
        assert standby.replicas.pick("m") == endpoint("r1")
        # the next leader's state differs: r1 left, r9 came, k1 was revoked meanwhile
        planes["cp3"].gateway.feed.keys_replaced([key("k2", "sk-2")])
        planes["cp3"].gateway.feed.replica_ready(endpoint("r9"))
        # cp3's gateway state, served as the leader's (leadership itself: tests/e2e/test_standby_serves.py)
        next_leader = planes["cp3"]
        next_leader.serving = StateServing(
            next_leader.state, planes["cp1"].leadership, next_leader.requests.append
        )
        link.to = "cp3"
        link.refused = False
        await eventually(lambda: follower.connected)
        assert standby.replicas.get("r1") is None
        assert standby.replicas.get("r9") == endpoint("r9")
        assert standby.keys.lookup("sk-1") is None


async def test_requests_reach_the_leader_and_wait_while_no_stream_is_up(planes: dict[str, Plane]) -> None:
    link = Link(planes, "cp1")
    link.refused = True
    record = UsageRecord("k1", "m", "r1", 3, 4, 200, 0.5, place="user:ann", ttft_s=0.1)
    async with following(planes, link) as follower:
        follower.request(Usage(record))
        follower.request(Wanted("m"))
        await asyncio.sleep(0)
        assert planes["cp1"].requests == []
        link.refused = False
        await eventually(lambda: len(planes["cp1"].requests) == 2)
    assert planes["cp1"].requests == [Usage(record), Wanted("m")]


def test_the_leaders_dispatcher_hands_each_request_to_its_part() -> None:
    seen: list[object] = []
    dispatch = request_dispatcher(
        seen.append,
        seen.append,
        seen.append,
        lambda r, why: seen.append((r, why)),
        lambda tokens, plane: seen.append((tokens, plane)),
        on_usage_sums=seen.append,
    )
    record = UsageRecord("k1", "m", "r1", 3, 4, 200, 0.5)
    sums = [["k1", "m", "", 2, 0, 6, 8, 1.0, 0, 0.0, 1.0]]
    for request in (
        Usage(record),
        UsageSummed(tuple(tuple(row) for row in sums)),
        Wanted("a"),
        Used("b"),
        ReplicaFailed("r1", "refused"),
        Counted({"key:k1": 12}, "cp2"),
        Counted({"key:k1": 1}),  # from a plane of an older release (tests/controlplane/test_state_events.py)
    ):
        dispatch(request)
    assert seen == [record, sums, "a", "b", ("r1", "refused"), ({"key:k1": 12}, "cp2"), ({"key:k1": 1}, "")]
    with pytest.raises(ValueError, match="unknown request 'in_flight'"):
        dispatch(InFlight({}, {}))  # a worker's, which its control plane keeps


async def test_the_leader_refuses_nodes_unlisted_planes_and_a_standby_refuses_to_stream(
    planes: dict[str, Plane],
) -> None:
    _, theirs = memory_state_pair()
    with pytest.raises(Unauthorized, match="is a node's"):
        await planes["cp1"].serving.serve(RelayPeer("cp2", control_plane=False), theirs)
    with pytest.raises(Unauthorized, match="names no control plane"):
        await planes["cp1"].serving.serve(RelayPeer("cp9", control_plane=True), theirs)
    with pytest.raises(NotLeader):
        await planes["cp2"].serving.serve(RelayPeer("cp1", control_plane=True), theirs)


async def test_a_standby_holding_a_copy_serves_v1_itself_and_relays_only_api(
    planes: dict[str, Plane],
) -> None:
    relayed: list[str] = []

    async def relay(address: str, request: Any, body: Any, connect_s: float) -> AsyncIterator[Any]:
        relayed.append(request.path)
        if request.path.startswith("/v1"):
            raise ChannelClosed("the leader is gone", "wait")
        yield RelayChunk(status=200, data=b"{}")

    live = False
    standby = planes["cp2"]
    front = StandbyForwarding(standby.gateway.asgi_app(), standby.leadership, relay, 0.1, lambda: live)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://cp2") as client:
        waited = await client.get("/v1/models", headers={"Authorization": "Bearer sk-1"})
        assert waited.status_code == 503  # relayed to a leader that is gone, until the wait ran out
        assert relayed and set(relayed) == {"/v1/models"}
        tried = len(relayed)
        live = True
        answer = await client.get("/v1/models", headers={"Authorization": "Bearer sk-1"})
        api = await client.get("/api/status")
        assert relayed[tried:] == ["/api/status"]
        assert api.status_code == 200
        assert answer.status_code == 401  # the standby's own gateway answered


def runtime_lora_catalog() -> list[ModelDefinition]:
    model = {
        "name": "lm",
        "source": {"sha256": SHA, "format": "safetensors"},
        "profile": {"engine": "vllm", "max_loaded_adapters": 2},
        "adapters": [
            {"name": "lm-sql", "sha256": SHA, "files": [{"sha256": SHA, "filename": "adapter_config.json"}]}
        ],
    }
    return [parse_model(model)]


async def test_a_standby_leaves_requests_naming_a_runtime_adapter_to_the_leader(
    planes: dict[str, Plane],
) -> None:
    """Only the leader loads adapters at run time: a standby serving /v1 relays every request that names
    one (the leader's residency then places it: loaded once per replica), and serves the rest itself."""
    relayed: list[bytes] = []

    async def relay(address: str, request: Any, body: Any, connect_s: float) -> AsyncIterator[RelayChunk]:
        relayed.append(b"".join([data async for data in body]))
        yield RelayChunk(status=200, data=b'{"answered_by": "cp1"}')

    standby = planes["cp2"]
    standby.gateway.feed.catalog_replaced(runtime_lora_catalog())
    decides = RuntimeAdapters(standby.gateway.adapters, 1 << 20)
    front = StandbyForwarding(
        standby.gateway.asgi_app(), standby.leadership, relay, 1.0, lambda: True, decides
    )
    adapter_body = b'{"model": "lm-sql", "messages": [{"role": "user", "content": "hi"}]}'
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://cp2") as client:
        to_leader = await client.post("/v1/chat/completions", content=adapter_body)
        here = await client.post("/v1/chat/completions", content=b'{"model": "lm", "messages": []}')
    assert to_leader.json() == {"answered_by": "cp1"}
    assert relayed == [adapter_body]  # the body went on whole, after the standby read it
    assert here.status_code == 401  # the standby's own gateway answered (no key)
    standby.gateway.feed.catalog_replaced(catalog())  # adapters given at start: nothing is peeked at
    assert not decides.peek()
    assert not decides.named_in(b'{"model": "m-sql"}') and not decides.named_in(b"not json")


def test_a_subscriber_that_falls_too_far_behind_is_dropped_to_take_a_new_full_copy() -> None:
    state = GatewayState(Gateway().feed)
    copy, queue = state.subscribe()
    assert copy[-1] == Live()
    for n in range(QUEUE_MAX + 1):
        state.feed.set_stopped(n % 2 == 0)
    assert queue.qsize() == QUEUE_MAX + 1
    events = [queue.get_nowait() for _ in range(queue.qsize())]
    assert events[-1] is OVERFLOW  # its stream ends; the standby reconnects for a full copy
    state.feed.set_stopped(False)
    assert queue.empty()  # no longer fed


async def test_a_new_leader_drops_the_inherited_replicas_its_fleet_does_not_know_after_the_grace(
    planes: dict[str, Plane],
) -> None:
    leader = planes["cp1"]
    leader.gateway.feed.replica_ready(endpoint("r1"))  # came back: its node registered again
    leader.gateway.feed.replica_ready(endpoint("r2"))  # its node never did
    task = asyncio.create_task(drop_inherited(leader.state, leader.leadership, lambda: {"r1"}, 0.2))
    try:
        await asyncio.sleep(0)
        assert leader.gateway.replicas.get("r2") is not None  # kept meanwhile: it may still answer
        await eventually(lambda: leader.gateway.replicas.get("r2") is None)
        assert leader.gateway.replicas.get("r1") == endpoint("r1")
    finally:
        task.cancel()


async def test_a_standby_following_takes_its_share_of_the_limits_and_the_leader_the_rest_once_it_goes(
    planes: dict[str, Plane],
) -> None:
    leader = planes["cp1"]
    sharing = LimitSharing("cp1", leader.gateway.feed, lambda: leader.leadership.serving)
    leader.serving = StateServing(
        leader.state,
        leader.leadership,
        leader.requests.append,
        on_follower=lambda plane, joined: sharing.joined(plane) if joined else sharing.left(plane),
    )
    leader.gateway.limiter.plane = "cp1"
    planes["cp2"].gateway.limiter.plane = "cp2"
    fill(leader.gateway.feed)
    sharing.divide()

    def share(plane: str) -> float:
        meter = planes[plane].gateway.limiter.meter("key:k1")
        assert meter is not None
        return meter.share

    assert share("cp1") == 1.0
    link = Link(planes, "cp1")
    async with following(planes, link) as follower:
        await eventually(lambda: follower.live)
        assert share("cp2") == 0.5  # from its full copy
        assert share("cp1") == 0.5
        sharing.used("cp2", {"key:k1": 50})
        sharing.tick()
        await eventually(lambda: share("cp2") == pytest.approx(0.9))
        assert share("cp1") == pytest.approx(0.1)
        link.refused = True
        await link.break_off()
        await eventually(lambda: share("cp1") == 1.0)
        assert share("cp2") == pytest.approx(0.9)  # kept while it has no stream: the cluster admits less


class UsageRows:
    """Stands in for the store's usage log: the rows a usage writer stores."""

    def __init__(self) -> None:
        self.rows: list[UsageEntry] = []

    async def append(self, entries: Sequence[UsageEntry]) -> None:
        self.rows.extend(entries)

    async def append_missing(self, entries: Sequence[UsageEntry]) -> int:
        raise AssertionError("without a spill nothing is replayed")


def mixed_usage(n: int, start: int = 0) -> list[UsageRecord]:
    """``n`` requests over 3 keys, 2 models and 2 places: failures, streams, answers without tokens."""
    return [
        UsageRecord(
            f"k{i % 3}",
            ("m", "e")[i % 2],
            "r1",
            prompt_tokens=i % 7,
            completion_tokens=i % 5,
            status=502 if i % 4 == 0 else 200,
            duration_s=(i % 9) / 8,
            place=("user:ann", "")[i % 5 == 0],
            ttft_s=(i % 3) / 16 if i % 2 else None,
            generation_s=(i % 4) / 32,
        )
        for i in range(start, start + n)
    ]


async def stored(requests: list[Request]) -> list[UsageEntry]:
    """The rows the leader's usage writer stores for ``requests`` (as its dispatcher hands them on)."""
    rows = UsageRows()
    writer = UsageWriter(rows, lambda: NOW, interval_s=3600)
    ignore: Any = lambda *args: None  # noqa: E731
    dispatch = request_dispatcher(writer.add, ignore, ignore, ignore, ignore, on_usage_sums=writer.add_sums)
    for request in requests:
        dispatch(request)
    assert await writer.flush()
    return sorted(rows.rows, key=repr)


async def test_a_standbys_usage_reaches_the_leader_as_sums_once_per_tick_and_is_stored_as_the_leaders(
    planes: dict[str, Plane],
) -> None:
    records = mixed_usage(1000)
    leaders: list[Request] = []  # the leader's own gateway: each request done at once
    leader = StateFollowing(
        planes["cp1"].state, planes["cp1"].leadership, Link(planes, "cp2"), leaders.append
    )
    for record in records:
        leader.usage(record)
    assert len(leaders) == 1000

    async with following(planes, Link(planes, "cp1")) as follower:
        await eventually(lambda: follower.live)
        for record in records:
            follower.usage(record)
            follower.used(record.model)
        await eventually(lambda: sum(isinstance(r, Used) for r in planes["cp1"].requests) == 2)
        await eventually(lambda: any(isinstance(r, UsageSummed) for r in planes["cp1"].requests))
    sent = planes["cp1"].requests
    # one message for the thousand requests (they came within one tick), one per model used
    assert sorted(r.kind for r in sent) == ["usage_sums", "used", "used"]
    assert sorted(r.model for r in sent if isinstance(r, Used)) == ["e", "m"]
    rows = await stored(sent)
    assert rows == await stored(leaders)
    assert sum(row.requests for row in rows) == 1000
    assert len(rows) == 3 * 2 * 2


async def test_a_standbys_usage_is_held_as_sums_while_the_stream_is_down_and_sent_once_it_is_back(
    planes: dict[str, Plane],
) -> None:
    before, during = mixed_usage(300), mixed_usage(700, start=300)
    link = Link(planes, "cp1")
    sent = planes["cp1"].requests
    async with following(planes, link) as follower:
        await eventually(lambda: follower.connected)
        for record in before:
            follower.usage(record)
        await eventually(lambda: len(sent) == 1)
        link.refused = True
        await link.break_off()
        await eventually(lambda: not follower.connected)
        for record in during:  # no stream to send on: summed, however many
            follower.usage(record)
        follower.used("m")
        follower.request(Wanted("e"))
        link.refused = False
        await eventually(lambda: len(sent) == 4)
    assert sorted(r.kind for r in sent[1:]) == ["usage_sums", "used", "wanted"]
    rows = await stored(sent)
    assert sum(row.requests for row in rows) == 1000  # none lost, none counted twice
    assert rows == await stored([Usage(record) for record in before + during])


async def test_a_standby_that_comes_to_lead_does_the_usage_it_held_itself_none_lost_none_twice(
    planes: dict[str, Plane],
) -> None:
    held, after = mixed_usage(400), mixed_usage(100, start=400)
    link = Link(planes, "cp1")
    own = planes["cp2"].requests
    async with following(planes, link) as follower:
        await eventually(lambda: follower.connected)
        link.refused = True
        await link.break_off()
        await eventually(lambda: not follower.connected)
        for record in held:  # no leader to send to: summed and held
            follower.usage(record)
        follower.used("m")
        assert not own
        await planes["cp1"].leadership.resign()
        await planes["cp2"].leadership.round()
        assert planes["cp2"].leadership.serving
        await eventually(lambda: any(isinstance(r, UsageSummed) for r in own))
        for record in after:  # leading now: each request's usage done at once
            follower.usage(record)
    assert not planes["cp1"].requests
    assert sorted(r.kind for r in own[:2]) == ["usage_sums", "used"]
    rows = await stored(own)
    assert sum(row.requests for row in rows) == 500
    assert rows == await stored([Usage(record) for record in held + after])
