"""Rolling a signed release over the agents: checked first, then one node at a time."""

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


def upgrades_of(fleet: Fleet, mirror: BlobStore, tmp_path: Path, **kwargs: object) -> AgentUpgrades:
    return AgentUpgrades(fleet, mirror, tmp_path / "trusted.pub", poll_s=0.01, **kwargs)  # type: ignore[arg-type]


def release_of(upgrades: AgentUpgrades, release_dir: Path) -> UpgradeAgent:
    return upgrades.release((release_dir / SUMS).read_text(), (release_dir / SIGNATURE).read_text())


async def test_nodes_upgrade_one_at_a_time(mirror: BlobStore, release_dir: Path, tmp_path: Path) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    first, second = register(fleet, "n1", "1.0.0"), register(fleet, "n2", "1.0.0")
    upgrades = upgrades_of(fleet, mirror, tmp_path)
    release = release_of(upgrades, release_dir)
    assert [f.filename for f in release.files] == [WHEEL] and release.files[0].size == len(b"version two")
    upgrades.start(release)
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
    mirror: BlobStore, release_dir: Path, tmp_path: Path
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    first, second = register(fleet, "n1", "1.0.0"), register(fleet, "n2", "1.0.0")
    upgrades = upgrades_of(fleet, mirror, tmp_path)
    upgrades.start(release_of(upgrades, release_dir), ["n1", "n2"])
    await eventually(lambda: len(first.sent) == 1)
    upgrades.on_result("n1", UpgradeResult("2.0.0", "the release's signature does not match"))
    rollout = await upgrades.wait()
    assert rollout is not None and rollout.upgraded == []
    assert "n1 did not upgrade: the release's signature does not match" in rollout.error
    assert second.sent == []


async def test_a_node_that_never_comes_back_stops_the_rollout(
    mirror: BlobStore, release_dir: Path, tmp_path: Path
) -> None:
    clock = FakeClock()
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    first, second = register(fleet, "n1", "1.0.0"), register(fleet, "n2", "1.0.0")
    upgrades = upgrades_of(fleet, mirror, tmp_path, node_timeout_s=60.0, clock=clock.monotonic)
    upgrades.start(release_of(upgrades, release_dir))
    await eventually(lambda: len(first.sent) == 1)
    await clock.advance(61)
    rollout = await upgrades.wait()
    assert rollout is not None and "n1 did not register with llmgw 2.0.0 within 60 s" in rollout.error
    assert second.sent == []


async def test_nodes_at_the_version_already_are_skipped(
    mirror: BlobStore, release_dir: Path, tmp_path: Path
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    first = register(fleet, "n1", "2.0.0")
    upgrades = upgrades_of(fleet, mirror, tmp_path)
    upgrades.start(release_of(upgrades, release_dir))
    rollout = await upgrades.wait()
    assert rollout is not None and rollout.upgraded == ["n1"] and first.sent == []


async def test_the_leader_refuses_a_release_its_key_did_not_sign(
    mirror: BlobStore, release_dir: Path, tmp_path: Path
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    generate_signing_key(tmp_path / "other.key", tmp_path / "other.pub")
    upgrades = AgentUpgrades(fleet, mirror, tmp_path / "other.pub")
    with pytest.raises(UntrustedRelease, match="does not trust"):
        release_of(upgrades, release_dir)
    with pytest.raises(UntrustedRelease, match="not signed"):
        upgrades.release((release_dir / SUMS).read_text(), "")


async def test_a_release_whose_files_are_not_in_the_mirror_is_refused(
    release_dir: Path, tmp_path: Path
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    upgrades = AgentUpgrades(fleet, BlobStore(tmp_path / "empty"), tmp_path / "trusted.pub")
    with pytest.raises(NotFound, match="is not in the mirror"):
        release_of(upgrades, release_dir)


async def test_the_sent_release_is_what_the_agent_reads(
    mirror: BlobStore, release_dir: Path, tmp_path: Path
) -> None:
    fleet = Fleet(on_ready=lambda r, url: None, on_gone=lambda replica_id: None)
    release = release_of(AgentUpgrades(fleet, mirror, tmp_path / "trusted.pub"), release_dir)
    assert release.sums == (release_dir / SUMS).read_text()
    assert release.signature == (release_dir / SIGNATURE).read_text().strip()
