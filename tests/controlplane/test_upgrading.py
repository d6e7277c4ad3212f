"""Rolling a signed release over the agents: checked first, then one node at a time, each step kept
in the store so that a new leader carries the rollout on."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controlplane.lifecycle.upgrading import AgentUpgrades
from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.devices import NodeInventory
from llmgw.core.nodes import NodeRegistration
from llmgw.core.upgrades import UpgradeAgent, UpgradeResult
from llmgw.errors import NotFound, Unauthorized, UntrustedRelease
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.releases import SIGNATURE, SUMS, write_release
from llmgw.pki.signing import generate_signing_key
from llmgw.store.database import Store
from llmgw.store.leases import Fence, Leases
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually

WHEEL = "llmgw-2.0.0-py3-none-any.whl"


class Link:
    """A node's stream as the control plane holds it: what was sent down it."""

    def __init__(self) -> None:
        self.sent: list[object] = []

    async def send(self, message: object) -> None:
        self.sent.append(message)

    async def close(self) -> None:
        pass


def register(fleet: Fleet, node_id: str, version: str) -> Link:
    link = Link()
    inventory = NodeInventory(node_id=node_id, address="127.0.0.1", cpu_cores=4, memory_mb=8192)
    fleet.attach(NodeRegistration(inventory=inventory, agent_version=version), link)  # type: ignore[arg-type]
    return link


@pytest.fixture
def release_dir(tmp_path: Path) -> Path:
    generate_signing_key(tmp_path / "release.key", tmp_path / "trusted.pub")
    (tmp_path / WHEEL).write_bytes(b"version two")
    write_release(tmp_path / "release", tmp_path / WHEEL, tmp_path / "release.key")
    return tmp_path / "release"


@pytest.fixture
async def mirror(tmp_path: Path, release_dir: Path) -> BlobStore:
    blobs = BlobStore(tmp_path / "mirror")
    await blobs.import_file(release_dir / WHEEL)
    return blobs


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    yield store
    await store.close()


def upgrades_of(
    fleet: Fleet, mirror: BlobStore, tmp_path: Path, store: Store, **kwargs: object
) -> AgentUpgrades:
    return AgentUpgrades(fleet, mirror, tmp_path / "trusted.pub", store, poll_s=0.01, **kwargs)  # type: ignore[arg-type]


def release_of(upgrades: AgentUpgrades, release_dir: Path) -> UpgradeAgent:
    return upgrades.release((release_dir / SUMS).read_text(), (release_dir / SIGNATURE).read_text())


async def test_nodes_upgrade_one_at_a_time(
    mirror: BlobStore, release_dir: Path, tmp_path: Path, store: Store
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    first, second = register(fleet, "n1", "1.0.0"), register(fleet, "n2", "1.0.0")
    upgrades = upgrades_of(fleet, mirror, tmp_path, store)
    release = release_of(upgrades, release_dir)
    assert [f.filename for f in release.files] == [WHEEL] and release.files[0].size == len(b"version two")
    await upgrades.start(release)
    await eventually(lambda: first.sent == [release])
    wheel = release.files[0].sha256
    fleet.check_fetch("n1", wheel)  # the node upgrading may fetch the release's files
    with pytest.raises(Unauthorized):
        fleet.check_fetch("n2", wheel)  # the next one not yet
    assert second.sent == []
    register(fleet, "n1", "2.0.0")  # n1's agent started again on the new version
    await eventually(lambda: second.sent == [release])
    register(fleet, "n2", "2.0.0")
    rollout = await upgrades.wait()
    assert (
        rollout is not None and rollout.upgraded == ["n1", "n2"] and rollout.error == "" and rollout.finished
    )
    assert fleet.release_blobs == {}


async def test_a_node_that_refuses_stops_the_rollout(
    mirror: BlobStore, release_dir: Path, tmp_path: Path, store: Store
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    first, second = register(fleet, "n1", "1.0.0"), register(fleet, "n2", "1.0.0")
    upgrades = upgrades_of(fleet, mirror, tmp_path, store)
    await upgrades.start(release_of(upgrades, release_dir), ["n1", "n2"])
    await eventually(lambda: len(first.sent) == 1)
    upgrades.on_result("n1", UpgradeResult("2.0.0", "the release's signature does not match"))
    rollout = await upgrades.wait()
    assert rollout is not None and rollout.upgraded == []
    assert "n1 did not upgrade: the release's signature does not match" in rollout.error
    assert second.sent == []


async def test_a_node_that_never_comes_back_stops_the_rollout(
    mirror: BlobStore, release_dir: Path, tmp_path: Path, store: Store
) -> None:
    clock = FakeClock()
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    first, second = register(fleet, "n1", "1.0.0"), register(fleet, "n2", "1.0.0")
    upgrades = upgrades_of(fleet, mirror, tmp_path, store, node_timeout_s=60.0, clock=clock.monotonic)
    await upgrades.start(release_of(upgrades, release_dir))
    await eventually(lambda: len(first.sent) == 1)
    await clock.advance(61)
    rollout = await upgrades.wait()
    assert rollout is not None and "n1 did not register with llmgw 2.0.0 within 60 s" in rollout.error
    assert second.sent == []


async def test_nodes_at_the_version_already_are_skipped(
    mirror: BlobStore, release_dir: Path, tmp_path: Path, store: Store
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    first = register(fleet, "n1", "2.0.0")
    upgrades = upgrades_of(fleet, mirror, tmp_path, store)
    await upgrades.start(release_of(upgrades, release_dir))
    rollout = await upgrades.wait()
    assert rollout is not None and rollout.upgraded == ["n1"] and first.sent == []


async def test_the_leader_refuses_a_release_its_key_did_not_sign(
    mirror: BlobStore, release_dir: Path, tmp_path: Path, store: Store
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    generate_signing_key(tmp_path / "other.key", tmp_path / "other.pub")
    upgrades = AgentUpgrades(fleet, mirror, tmp_path / "other.pub", store)
    with pytest.raises(UntrustedRelease, match="does not trust"):
        release_of(upgrades, release_dir)
    with pytest.raises(UntrustedRelease, match="not signed"):
        upgrades.release((release_dir / SUMS).read_text(), "")


async def test_a_release_whose_files_are_not_in_the_mirror_is_refused(
    release_dir: Path, tmp_path: Path, store: Store
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    upgrades = AgentUpgrades(fleet, BlobStore(tmp_path / "empty"), tmp_path / "trusted.pub", store)
    with pytest.raises(NotFound, match="is not in the mirror"):
        release_of(upgrades, release_dir)


async def test_the_sent_release_is_what_the_agent_reads(
    mirror: BlobStore, release_dir: Path, tmp_path: Path, store: Store
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    release = release_of(AgentUpgrades(fleet, mirror, tmp_path / "trusted.pub", store), release_dir)
    assert release.sums == (release_dir / SUMS).read_text()
    assert release.signature == (release_dir / SIGNATURE).read_text().strip()


async def leading(url: str, name: str, clock: FakeClock) -> Store:
    """A control plane's store once it took the lease: its writes fenced at its epoch."""
    store = await Store.open(url, clock=clock)
    epoch = await Leases(store).acquire(name, 30.0)
    assert epoch is not None
    store.fence = Fence(name, epoch)
    return store


async def deposed(store: Store) -> None:
    """The leader of ``store`` gone: its lease lapses (and its later writes are refused)."""
    assert store.fence is not None and store.fence.epoch is not None
    await Leases(store).release(store.fence.name, store.fence.epoch)


def fleet_of(*nodes: tuple[str, str]) -> tuple[Fleet, dict[str, Link]]:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    return fleet, {node_id: register(fleet, node_id, version) for node_id, version in nodes}


async def test_a_new_leader_carries_the_rollout_on_from_the_node_it_was_at(
    mirror: BlobStore, release_dir: Path, tmp_path: Path
) -> None:
    clock, url = FakeClock(), f"sqlite+aiosqlite:///{tmp_path / 'ha.db'}"
    first = await leading(url, "cp1", clock)
    fleet, links = fleet_of(("n1", "1.0.0"), ("n2", "1.0.0"), ("n3", "1.0.0"))
    cp1 = upgrades_of(fleet, mirror, tmp_path, first, node_timeout_s=60.0, clock=clock.monotonic)
    release = release_of(cp1, release_dir)
    await cp1.start(release)
    await eventually(lambda: links["n1"].sent == [release])
    register(fleet, "n1", "2.0.0")
    await eventually(lambda: links["n2"].sent == [release])  # cp1 goes, n2 upgrading
    await deposed(first)

    second = await leading(url, "cp2", clock)
    fleet2, _ = fleet_of()
    cp2 = upgrades_of(fleet2, mirror, tmp_path, second, node_timeout_s=60.0, clock=clock.monotonic)
    await cp2.take_over()
    assert cp2.rollout is not None and (cp2.rollout.upgraded, cp2.rollout.current) == (["n1"], "n2")
    register(fleet2, "n1", "2.0.0")  # the agents come to the new leader
    n2, n3 = register(fleet2, "n2", "1.0.0"), register(fleet2, "n3", "1.0.0")
    await eventually(lambda: n2.sent == [release])  # sent again (an agent upgrading already ignores it)
    assert n3.sent == []
    register(fleet2, "n2", "2.0.0")
    await eventually(lambda: n3.sent == [release])
    register(fleet2, "n3", "2.0.0")
    rollout = await cp2.wait()
    assert rollout is not None and (rollout.upgraded, rollout.error, rollout.finished) == (
        ["n1", "n2", "n3"],
        "",
        True,
    )
    kept = await second.leader_state.rollout()
    assert kept is not None and (kept.upgraded, kept.finished, kept.error) == (("n1", "n2", "n3"), True, "")

    await clock.advance(61)  # the old leader gives n2 up: its write is refused, and it sends no one else
    stopped = await cp1.wait()
    assert stopped is not None and "the new leader carries the rollout on" in stopped.error
    assert links["n3"].sent == [] and await second.leader_state.rollout() == kept
    await first.close()
    await second.close()


async def test_the_node_s_timeout_at_the_new_leader_counts_from_when_it_was_sent(
    mirror: BlobStore, release_dir: Path, tmp_path: Path
) -> None:
    clock, url = FakeClock(), f"sqlite+aiosqlite:///{tmp_path / 'ha.db'}"
    first = await leading(url, "cp1", clock)
    fleet, links = fleet_of(("n1", "1.0.0"), ("n2", "1.0.0"))
    cp1 = upgrades_of(fleet, mirror, tmp_path, first, node_timeout_s=60.0, clock=clock.monotonic)
    release = release_of(cp1, release_dir)
    await cp1.start(release)
    await eventually(lambda: links["n1"].sent == [release])
    await clock.advance(50)
    await deposed(first)

    second = await leading(url, "cp2", clock)
    fleet2, again = fleet_of(("n1", "1.0.0"), ("n2", "1.0.0"))
    cp2 = upgrades_of(fleet2, mirror, tmp_path, second, node_timeout_s=60.0, clock=clock.monotonic)
    await cp2.take_over()
    await eventually(lambda: again["n1"].sent == [release])
    await clock.advance(10)
    rollout = await cp2.wait()
    assert rollout is not None and "n1 did not register with llmgw 2.0.0 within 60 s" in rollout.error
    assert again["n2"].sent == [] and rollout.upgraded == []
    await cp1.wait()
    await first.close()
    await second.close()


async def test_a_rollout_the_new_leader_cannot_check_stops_with_the_reason(
    mirror: BlobStore, release_dir: Path, tmp_path: Path
) -> None:
    clock, url = FakeClock(), f"sqlite+aiosqlite:///{tmp_path / 'ha.db'}"
    first = await leading(url, "cp1", clock)
    fleet, _ = fleet_of(("n1", "1.0.0"))
    cp1 = upgrades_of(fleet, mirror, tmp_path, first, node_timeout_s=60.0, clock=clock.monotonic)
    await cp1.start(release_of(cp1, release_dir))
    await deposed(first)

    second = await leading(url, "cp2", clock)
    generate_signing_key(tmp_path / "other.key", tmp_path / "other.pub")
    fleet2, links = fleet_of(("n1", "1.0.0"))
    cp2 = AgentUpgrades(fleet2, mirror, tmp_path / "other.pub", second)
    await cp2.take_over()
    assert cp2.rollout is not None and cp2.rollout.finished
    assert "cannot be carried on here" in cp2.rollout.error and "does not trust" in cp2.rollout.error
    kept = await second.leader_state.rollout()
    assert kept is not None and kept.finished and kept.error == cp2.rollout.error
    assert links["n1"].sent == []
    await clock.advance(61)
    await cp1.wait()
    await first.close()
    await second.close()


async def test_a_new_leader_shows_the_last_rollout_as_it_ended(
    mirror: BlobStore, release_dir: Path, tmp_path: Path, store: Store
) -> None:
    fleet, links = fleet_of(("n1", "1.0.0"))
    cp1 = upgrades_of(fleet, mirror, tmp_path, store)
    release = release_of(cp1, release_dir)
    await cp1.start(release)
    await eventually(lambda: links["n1"].sent == [release])
    register(fleet, "n1", "2.0.0")
    ended = await cp1.wait()
    cp2 = upgrades_of(fleet_of()[0], mirror, tmp_path, store)
    await cp2.take_over()
    assert cp2.rollout is not None and ended is not None
    assert (cp2.rollout.version, cp2.rollout.upgraded, cp2.rollout.finished) == ("2.0.0", ["n1"], True)
