"""The leader lease on the database's clock, and the fence that refuses a deposed leader's writes."""

from __future__ import annotations

import pytest

from llmgw.errors import NotLeader
from llmgw.store import Fence, Leases, Store
from llmgw.testing.clock import FakeClock


@pytest.fixture
def leases(store: Store, clock: FakeClock) -> Leases:
    """Leases on the database's clock, pushed on by as far as ``clock`` moves."""
    return Leases(store, clock.elapsed)


async def test_the_first_control_plane_takes_the_lease_at_epoch_one(leases: Leases) -> None:
    assert await leases.acquire("cp1", 10) == 1
    state = await leases.current()
    assert (state.holder, state.epoch, state.held) == ("cp1", 1, True)
    assert 9 < state.expires_in_s <= 10


async def test_a_held_lease_is_not_taken_by_another(leases: Leases, clock: FakeClock) -> None:
    await leases.acquire("cp1", 10)
    await clock.advance(9.5)
    assert await leases.acquire("cp2", 10) is None
    assert (await leases.current()).holder == "cp1"


async def test_a_lapsed_lease_goes_to_the_next_asker_with_a_new_epoch(
    leases: Leases, clock: FakeClock
) -> None:
    await leases.acquire("cp1", 10)
    await clock.advance(10.5)
    assert await leases.acquire("cp2", 10) == 2
    assert not await leases.renew("cp1", 1, 10)
    assert (await leases.current()).holder == "cp2"


async def test_renewing_keeps_the_lease_from_lapsing(leases: Leases, clock: FakeClock) -> None:
    epoch = await leases.acquire("cp1", 10)
    assert epoch is not None
    for _ in range(5):
        await clock.advance(4.0)
        assert await leases.renew("cp1", epoch, 10)
        assert await leases.acquire("cp2", 10) is None
    assert (await leases.current()).epoch == epoch


async def test_a_released_lease_is_free_at_once(leases: Leases) -> None:
    epoch = await leases.acquire("cp1", 10)
    assert epoch is not None
    await leases.release("cp1", epoch)
    assert await leases.acquire("cp2", 10) == epoch + 1


async def test_the_holder_writes_under_its_fence(store: Store, leases: Leases) -> None:
    epoch = await leases.acquire("cp1", 10)
    store.fence = Fence("cp1", epoch)
    await store.audit.record("admin", "model.add", "m")
    await store.settings.set("serving.stopped", True, "admin")
    assert [e.action for e in await store.audit.list()] == ["model.add"]


async def test_a_deposed_leader_cannot_write(store: Store, leases: Leases, clock: FakeClock) -> None:
    epoch = await leases.acquire("cp1", 10)
    store.fence = Fence("cp1", epoch)
    await clock.advance(11)
    assert await leases.acquire("cp2", 10) == 2
    with pytest.raises(NotLeader, match="lost the lease"):
        await store.audit.record("admin", "model.add", "m")
    with pytest.raises(NotLeader):
        await store.settings.set("serving.stopped", True, "admin")
    with pytest.raises(NotLeader):
        await store.models.remove("anything")
    assert await store.audit.list() == []


async def test_a_standby_reads_but_does_not_write(store: Store, leases: Leases) -> None:
    await leases.acquire("cp1", 10)
    store.fence = Fence("cp2", None)
    assert await store.models.list() == []
    with pytest.raises(NotLeader, match="does not lead"):
        await store.audit.record("admin", "model.add", "m")


async def test_the_lease_itself_is_written_outside_the_fence(store: Store, leases: Leases) -> None:
    store.fence = Fence("cp1", None)
    assert await leases.acquire("cp1", 10) == 1
    await leases.announce("cp1", "127.0.0.1:8443", "http://127.0.0.1:8080")


async def test_control_planes_announce_themselves(leases: Leases, clock: FakeClock) -> None:
    await leases.announce("cp2", "10.0.0.2:8443", "http://10.0.0.2:8080")
    await leases.announce("cp1", "10.0.0.1:8443", "http://10.0.0.1:8080")
    await clock.advance(3)
    await leases.announce("cp1", "10.0.0.9:8443", "http://10.0.0.9:8080")
    planes = await leases.control_planes()
    assert [(p.name, p.agent_address) for p in planes] == [("cp1", "10.0.0.9:8443"), ("cp2", "10.0.0.2:8443")]
    assert planes[0].seen_ago_s < 1 < 2.5 < planes[1].seen_ago_s
    await leases.forget("cp2")
    assert [p.name for p in await leases.control_planes()] == ["cp1"]
