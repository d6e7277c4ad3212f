"""Leadership: one leader at a time, failover after the lease lapses, and the store-outage rules."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controlplane.lifecycle.leadership import LEADING, PAUSED, STANDBY, Identity, Leadership
from llmgw.errors import NotLeader, StoreUnavailable
from llmgw.store import Fence, Leases, LeaseState, Store
from llmgw.store.leases import ControlPlaneRecord
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually


class Outage:
    """Leases that fail like an unreachable store while ``out`` is set."""

    def __init__(self, leases: Leases) -> None:
        self._leases = leases
        self.out = False

    def _check(self) -> None:
        if self.out:
            raise StoreUnavailable("the store did not answer within 5 s", hint="check the database")

    async def acquire(self, name: str, ttl_s: float) -> int | None:
        self._check()
        return await self._leases.acquire(name, ttl_s)

    async def renew(self, name: str, epoch: int, ttl_s: float) -> bool:
        self._check()
        return await self._leases.renew(name, epoch, ttl_s)

    async def release(self, name: str, epoch: int) -> None:
        self._check()
        await self._leases.release(name, epoch)

    async def current(self) -> LeaseState:
        self._check()
        return await self._leases.current()

    async def announce(self, name: str, agent_address: str, http_address: str) -> None:
        self._check()
        await self._leases.announce(name, agent_address, http_address)

    async def control_planes(self) -> list[ControlPlaneRecord]:
        self._check()
        return await self._leases.control_planes()


@pytest.fixture
def time_() -> FakeClock:
    """One fake time for the processes' monotonic clocks and, as how far it moved, the database's."""
    return FakeClock()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}")
    try:
        yield store
    finally:
        await store.close()


def control_plane(store: Store, time_: FakeClock, name: str, leases: object | None = None) -> Leadership:
    changes: list[str] = []
    leadership = Leadership(
        leases or Leases(store, time_.elapsed),  # type: ignore[arg-type]
        Fence(name),
        Identity(name, f"{name}:8443", f"http://{name}:8080"),
        lease_s=10,
        on_change=changes.append,
        clock=time_.monotonic,
    )
    leadership.changes = changes  # type: ignore[attr-defined]
    return leadership


async def test_the_first_control_plane_leads_and_the_second_stands_by(store: Store, time_: FakeClock) -> None:
    cp1, cp2 = control_plane(store, time_, "cp1"), control_plane(store, time_, "cp2")
    await cp1.round()
    await cp2.round()
    assert (cp1.state, cp2.state) == (LEADING, STANDBY)
    assert cp2.leader is not None and cp2.leader.agent_address == "cp1:8443"
    assert [p.name for p in cp2.control_planes] == ["cp1", "cp2"]


async def test_a_renewing_leader_keeps_the_lease_through_many_rounds(store: Store, time_: FakeClock) -> None:
    cp1, cp2 = control_plane(store, time_, "cp1"), control_plane(store, time_, "cp2")
    for _ in range(20):
        await cp1.round()
        await cp2.round()
        await time_.advance(cp1.round_s)
        cp1.expire()
    assert (cp1.state, cp2.state, cp1.epoch) == (LEADING, STANDBY, 1)
    assert cp1.changes == [LEADING]  # type: ignore[attr-defined]


async def test_a_standby_leads_once_a_silent_leader_s_lease_lapses(store: Store, time_: FakeClock) -> None:
    cp1, cp2 = control_plane(store, time_, "cp1"), control_plane(store, time_, "cp2")
    await cp1.round()
    await time_.advance(9.9)
    await cp2.round()
    assert cp2.state == STANDBY
    await time_.advance(0.2)
    await cp2.round()
    assert (cp2.state, cp2.epoch) == (LEADING, 2)


async def test_a_deposed_leader_stands_down_and_its_writes_are_refused(
    store: Store, time_: FakeClock
) -> None:
    cp1, cp2 = control_plane(store, time_, "cp1"), control_plane(store, time_, "cp2")
    await cp1.round()
    fence = cp1._fence
    store.fence = fence
    await time_.advance(11)  # cp1 slept through its lease
    await cp2.round()
    with pytest.raises(NotLeader):
        await store.audit.record("cp1", "model.add", "m")  # still believes it leads: refused by the store
    await cp1.round()
    assert (cp1.state, fence.epoch) == (STANDBY, None)
    assert cp1.changes == [LEADING, STANDBY]  # type: ignore[attr-defined]


async def test_the_leader_pauses_when_the_store_is_away_for_a_lease_and_leads_again_after(
    store: Store, time_: FakeClock
) -> None:
    outage = Outage(Leases(store, time_.elapsed))
    cp1 = control_plane(store, time_, "cp1", outage)
    await cp1.round()
    outage.out = True
    for _ in range(9):  # 30 s without the store
        await time_.advance(cp1.round_s)
        await cp1.round()
    assert cp1.state == PAUSED and not cp1.leading
    outage.out = False
    await cp1.round()
    assert (cp1.state, cp1.epoch) == (LEADING, 1)


async def test_a_leader_renews_as_soon_as_the_store_returns_from_an_outage_shorter_than_the_lease(
    store: Store, time_: FakeClock
) -> None:
    outage = Outage(Leases(store, time_.elapsed))
    cp1 = control_plane(store, time_, "cp1", outage)
    await cp1.round()
    renewed_at = time_.monotonic()
    outage.out = True
    while time_.monotonic() - renewed_at < 2 * cp1.lease_s:  # as run() drives it
        await time_.advance(cp1.next_round_in())
        cp1.expire()
        if time_.monotonic() - renewed_at >= 0.85 * cp1.lease_s:  # a failover of 8.5 s in a 10 s lease
            outage.out = False
        await cp1.round()
    assert PAUSED not in cp1.changes  # type: ignore[attr-defined]
    assert (cp1.state, cp1.epoch) == (LEADING, 1)


async def leader_and_standby_through_an_outage(
    store: Store, time_: FakeClock
) -> tuple[Leadership, Leadership, Outage, Outage]:
    """cp1 leading, cp2 standing by, then 30 s with the store out of reach of both (both still out):
    the lease lapsed for everyone."""
    leader_view, standby_view = Outage(Leases(store, time_.elapsed)), Outage(Leases(store, time_.elapsed))
    cp1 = control_plane(store, time_, "cp1", leader_view)
    cp2 = control_plane(store, time_, "cp2", standby_view)
    await cp1.round()
    await cp2.round()
    leader_view.out = standby_view.out = True
    for _ in range(9):  # 30 s: the lease lapsed for everyone
        await time_.advance(cp1.round_s)
        await cp1.round()
        await cp2.round()
    return cp1, cp2, leader_view, standby_view


async def test_a_standby_leaves_the_lease_alone_after_the_store_returns(
    store: Store, time_: FakeClock
) -> None:
    cp1, cp2, leader_view, standby_view = await leader_and_standby_through_an_outage(store, time_)
    leader_view.out = standby_view.out = False
    await cp2.round()  # the standby happens to ask first
    await cp1.round()
    assert (cp1.state, cp2.state, cp1.epoch) == (LEADING, STANDBY, 1)
    await time_.advance(cp1.round_s)
    await cp2.round()
    assert cp2.state == STANDBY


async def test_a_standby_waits_out_a_leader_whose_call_hung_through_the_outage_and_replaces_a_dead_one(
    store: Store, time_: FakeClock
) -> None:
    """The leader's round is stuck on a call the outage left hanging (up to the store's timeout):
    the standby does not take the lease meanwhile; once that long passed with no renewal, it does."""
    cp1, cp2, leader_view, standby_view = await leader_and_standby_through_an_outage(store, time_)
    standby_view.out = False  # the store is back; cp1's call still hangs
    quiet = cp2.quiet_after_outage_s()
    assert quiet > cp2.round_s
    waited = 0.0
    while waited + 1.0 < quiet:
        await cp2.round()
        assert (cp2.state, cp2.epoch) == (STANDBY, None)
        await time_.advance(1.0)
        waited += 1.0
    leader_view.out = False  # cp1's call timed out; its next round renews
    await cp1.round()
    await cp2.round()
    assert (cp1.state, cp2.state, cp1.epoch) == (LEADING, STANDBY, 1)
    # The same outage again, and this time cp1 died in it: cp2 leads once the quiet time passed.
    leader_view.out = standby_view.out = True
    for _ in range(9):
        await time_.advance(cp1.round_s)
        await cp2.round()
    standby_view.out = False
    await cp2.round()
    await time_.advance(quiet)
    await cp2.round()
    assert (cp2.state, cp2.epoch) == (LEADING, 2)


async def test_control_planes_started_while_the_store_was_away_lead_as_soon_as_it_answers(
    store: Store, time_: FakeClock
) -> None:
    view = Outage(Leases(store, time_.elapsed))
    cp1 = control_plane(store, time_, "cp1", view)
    view.out = True
    await cp1.round()
    view.out = False
    await time_.advance(1.0)
    await cp1.round()
    assert (cp1.state, cp1.epoch) == (LEADING, 1)  # nobody led before: nobody to wait for


async def test_a_control_plane_that_resigned_follows_who_leads_next_without_asking_for_the_lease(
    store: Store, time_: FakeClock
) -> None:
    cp1 = control_plane(store, time_, "cp1")
    cp2 = control_plane(store, time_, "cp2")
    await cp1.round()
    await cp2.round()
    await cp1.resign()
    following = asyncio.create_task(cp1.follow())
    try:
        await eventually(lambda: cp1.holder == "", message="cp1 learns nobody leads")
        assert (await Leases(store, time_.elapsed).current()).holder == "cp1"  # released, not taken again
        await cp2.round()
        await eventually(
            lambda: cp1.leader is not None and cp1.leader.name == "cp2", message="cp1 learns cp2 leads"
        )
        assert (cp1.state, cp1.epoch, cp2.state) == (STANDBY, None, LEADING)
    finally:
        following.cancel()


async def test_resigning_frees_the_lease_at_once(store: Store, time_: FakeClock) -> None:
    cp1, cp2 = control_plane(store, time_, "cp1"), control_plane(store, time_, "cp2")
    await cp1.round()
    await cp1.resign()
    await cp2.round()
    assert (cp1.state, cp2.state) == (STANDBY, LEADING)


async def test_two_control_planes_never_lead_at_once_under_churn(store: Store, time_: FakeClock) -> None:
    planes = [control_plane(store, time_, f"cp{i}") for i in range(3)]
    for plane in planes:
        await plane.round()
    for _ in range(6):
        stalled = next(p for p in planes if p.epoch is not None)  # the leader stalls for 12 s
        for _step in range(4):
            await time_.advance(4.0)
            for plane in planes:
                if plane is not stalled:
                    await plane.round()
                plane.expire()
                assert sum(1 for p in planes if p.leading) <= 1
        await stalled.round()  # wakes up deposed
        assert sum(1 for p in planes if p.leading) == 1
    assert max(p.epoch or 0 for p in planes) == 7  # the lease changed hands six times


async def test_under_churn_the_audit_log_shows_one_leader_per_epoch_in_order(
    tmp_path: Path, time_: FakeClock
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'shared.db'}"
    stores = [await Store.open(url) for _ in range(3)]
    try:
        planes = []
        for index, store in enumerate(stores):
            fence = Fence(f"cp{index}")
            store.fence = fence
            planes.append(
                Leadership(
                    Leases(store, time_.elapsed),
                    fence,
                    Identity(f"cp{index}", "", ""),
                    lease_s=10,
                    clock=time_.monotonic,
                )
            )
        refused = 0
        for step in range(40):
            await time_.advance(4.0)
            for index, plane in enumerate(planes):
                if (step // 4) % 3 != index:  # each plane in turn sleeps through 16 s
                    await plane.round()
            for plane, store in zip(planes, stores, strict=True):
                if plane.state == LEADING:  # believes it leads, perhaps wrongly: the store decides
                    try:
                        await store.audit.record(plane.me.name, "act", str(plane.epoch))
                    except NotLeader:
                        refused += 1
        entries = sorted(await stores[0].audit.list(1000), key=lambda e: e.id)
        epochs = [int(e.target) for e in entries]
        assert epochs == sorted(epochs)  # no write of an older epoch after a newer one
        actors = {epoch: {e.actor for e in entries if int(e.target) == epoch} for epoch in epochs}
        assert all(len(names) == 1 for names in actors.values())
        assert len(actors) > 3 and refused > 0
    finally:
        for store in stores:
            await store.close()


async def test_a_control_plane_leads_only_once_it_has_read_what_it_keeps_in_memory(
    store: Store, time_: FakeClock
) -> None:
    failures = [StoreUnavailable("the store did not answer within 5 s", hint="check the database")]

    async def before_leading() -> None:
        if failures:
            raise failures.pop()

    cp1 = Leadership(
        Leases(store, time_.elapsed),
        Fence("cp1"),
        Identity("cp1", "", ""),
        lease_s=10,
        before_leading=before_leading,
        clock=time_.monotonic,
    )
    await cp1.round()
    assert (cp1.state, cp1.epoch) == (STANDBY, 1)  # holds the lease, does not lead yet
    await time_.advance(cp1.round_s)
    await cp1.round()
    assert (cp1.state, cp1.epoch) == (LEADING, 1)


async def test_a_leader_frozen_past_its_lease_stops_serving_the_moment_it_thaws(
    store: Store, time_: FakeClock
) -> None:
    cp1, cp2 = control_plane(store, time_, "cp1"), control_plane(store, time_, "cp2")
    await cp1.round()
    assert cp1.serving
    await time_.advance(11)  # cp1 frozen (SIGSTOP): no round, no expire(); cp2 takes the lease meanwhile
    await cp2.round()
    assert cp2.serving
    assert cp1.state == LEADING  # thawed, before any round or expiry ran: its state still says leading
    assert not cp1.serving and not cp1.leading
    cp1.expire()
    assert cp1.state == PAUSED and not cp1.serving  # paused, but no round saw the store away lately
    await cp1.round()
    assert (cp1.state, cp1.serving, cp2.serving) == (STANDBY, False, True)


async def test_a_leader_paused_by_a_store_outage_keeps_serving_while_its_rounds_see_the_outage(
    store: Store, time_: FakeClock
) -> None:
    outage = Outage(Leases(store, time_.elapsed))
    cp1 = control_plane(store, time_, "cp1", outage)
    await cp1.round()
    outage.out = True
    for _ in range(9):
        await time_.advance(cp1.round_s)
        await cp1.round()
        assert cp1.serving
    assert cp1.state == PAUSED
    await time_.advance(10.5)  # then no round for a whole lease: nothing says the outage still holds
    assert not cp1.serving
