"""Mirror replicating: a plane pulls what it lacks from its peers, and imports wait for the copies wanted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw.controlplane.config import MirrorSettings
from llmgw.controlplane.lifecycle.leadership import Identity
from llmgw.controlplane.mirror.replicating import MirrorReplicator
from llmgw.errors import NotFound
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store
from llmgw.store.leases import ControlPlaneRecord
from llmgw.testing.clock import FakeClock
from llmgw.testing.eventually import eventually

LIVE_S = 30.0
INTERVAL_S = 2.0


@dataclass
class Planes:
    """What leadership saw in its last round: this plane, the leader, every plane and when it was seen."""

    me: Identity
    holder: str = "cp1"
    control_planes: list[ControlPlaneRecord] = field(default_factory=list)


@dataclass
class Network:
    """Peers' mirrors by agent address, fetched from in memory; counts fetches under way at once."""

    mirrors: dict[str, BlobStore] = field(default_factory=dict)
    asked: list[tuple[str, str]] = field(default_factory=list)
    running: int = 0
    most: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def fetch(self, address: str, sha256: str, offset: int) -> AsyncIterator[bytes]:
        self.asked.append((address, sha256))
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            if address not in self.mirrors or not self.mirrors[address].has(sha256):
                raise NotFound(f"{address} lacks {sha256}", "import it")
            await self.gate.wait()
            async for chunk in self.mirrors[address].read_chunks(sha256, offset):
                yield chunk
        finally:
            self.running -= 1


class Cluster:
    """Control planes on one store, each with a mirror folder of its own, reached through ``network``."""

    def __init__(self, store: Store, root: Path, clock: FakeClock) -> None:
        self.store = store
        self.root = root
        self.clock = clock
        self.network = Network()
        self.network.gate.set()
        self.records: list[ControlPlaneRecord] = []

    def plane(
        self, name: str, copies: int = 0, concurrency: int = 2, ack_wait_s: float = 60
    ) -> MirrorReplicator:
        address = f"{name}:8443"
        blobs = BlobStore(self.root / name)
        self.network.mirrors[address] = blobs
        self.records.append(ControlPlaneRecord(name, address, f"http://{name}", 0.0))
        settings = MirrorSettings(
            copies=copies, concurrency=concurrency, interval_s=INTERVAL_S, ack_wait_s=ack_wait_s
        )
        planes = Planes(Identity(name, address, f"http://{name}"), control_planes=self.records)
        return MirrorReplicator(
            self.store, blobs, planes, self.network.fetch, settings, live_s=LIVE_S, clock=self.clock
        )

    def mirror(self, name: str) -> BlobStore:
        return self.network.mirrors[f"{name}:8443"]

    def away(self, name: str) -> None:
        """``name`` has not announced itself for longer than planes stay live."""
        self.records[:] = [
            ControlPlaneRecord(r.name, r.agent_address, r.http_address, LIVE_S + 1) if r.name == name else r
            for r in self.records
        ]

    async def imported(self, name: str, data: bytes, filename: str = "m.gguf") -> str:
        """``data`` imported on ``name``, as the upload route does (before it acknowledges)."""
        blobs = self.mirror(name)

        async def chunks() -> AsyncIterator[bytes]:
            yield data

        info = await blobs.import_stream(chunks(), filename)
        await self.store.blobs.add(info.sha256, info.size, filename, "weights")
        return info.sha256

    async def holders(self, sha256: str) -> list[str]:
        return [c.plane for c in await self.store.blob_copies.of(sha256)]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    clock = FakeClock()
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}", clock=clock)
    try:
        yield Cluster(store, tmp_path, clock)
    finally:
        await store.close()


async def test_a_plane_records_the_blobs_its_own_mirror_holds(cluster: Cluster) -> None:
    cp1 = cluster.plane("cp1")
    sha = await cluster.imported("cp1", b"weights")
    assert await cp1.sync() == 0
    assert await cluster.holders(sha) == ["cp1"]
    (copy,) = await cluster.store.blob_copies.of(sha)
    assert copy.address == "cp1:8443"


async def test_a_plane_pulls_a_blob_it_lacks_and_says_it_holds_it(cluster: Cluster) -> None:
    cp1, cp2 = cluster.plane("cp1"), cluster.plane("cp2")
    data = bytes(range(256)) * 10_000
    sha = await cluster.imported("cp1", data)
    await cp1.sync()
    assert await cp2.sync() == 1
    assert cluster.mirror("cp2").path_for(sha).read_bytes() == data
    assert await cluster.holders(sha) == ["cp1", "cp2"]
    assert await cp2.sync() == 0, "nothing is pulled twice"


async def test_a_blob_the_store_no_longer_lists_is_removed_from_every_plane(cluster: Cluster) -> None:
    cp1, cp2 = cluster.plane("cp1"), cluster.plane("cp2")
    sha = await cluster.imported("cp1", b"a client's file")
    kept = await cluster.imported("cp1", b"weights")
    await cp1.sync()
    await cp2.sync()
    assert cluster.mirror("cp2").has(sha)
    await cluster.store.blobs.remove(sha)  # the last file naming it was deleted (store/files.py)
    await cp1.sync()
    await cp2.sync()
    assert not cluster.mirror("cp1").has(sha) and not cluster.mirror("cp2").has(sha)
    assert await cluster.holders(sha) == []
    assert cluster.mirror("cp2").has(kept) and await cluster.holders(kept) == ["cp1", "cp2"]


async def test_pull_now_fetches_one_blob_before_the_next_pass(cluster: Cluster) -> None:
    cp1, cp2 = cluster.plane("cp1"), cluster.plane("cp2")
    sha = await cluster.imported("cp1", b"read at once")
    await cp1.sync()
    assert await cp2.pull_now(sha)
    assert cluster.mirror("cp2").path_for(sha).read_bytes() == b"read at once"
    assert await cluster.holders(sha) == ["cp1", "cp2"]
    assert not await cp2.pull_now("c" * 64), "a blob the store does not list is pulled from nowhere"


async def test_a_plane_not_live_is_not_pulled_from(cluster: Cluster) -> None:
    cp1, cp2 = cluster.plane("cp1"), cluster.plane("cp2")
    sha = await cluster.imported("cp1", b"weights")
    await cp1.sync()
    cluster.away("cp1")
    assert await cp2.sync() == 0
    assert cluster.network.asked == []
    assert await cluster.holders(sha) == ["cp1"]


async def test_pulls_run_at_most_concurrency_at_once(cluster: Cluster) -> None:
    cp1, cp2 = cluster.plane("cp1"), cluster.plane("cp2", concurrency=2)
    shas = [await cluster.imported("cp1", f"weights {n}".encode(), f"m{n}.gguf") for n in range(5)]
    await cp1.sync()
    cluster.network.gate.clear()
    pulling = asyncio.create_task(cp2.sync())
    await eventually(lambda: cluster.network.running == 2, message="two pulls under way")
    cluster.network.gate.set()
    assert await pulling == 5
    assert cluster.network.most == 2
    assert all(cluster.mirror("cp2").has(sha) for sha in shas)


async def test_a_copy_whose_file_went_missing_is_forgotten_and_pulled_again(cluster: Cluster) -> None:
    cp1, cp2 = cluster.plane("cp1"), cluster.plane("cp2")
    sha = await cluster.imported("cp1", b"weights")
    await cp1.sync()
    await cp2.sync()
    cluster.mirror("cp2").path_for(sha).unlink()
    assert await cp2.sync() == 1
    assert cluster.mirror("cp2").has(sha)
    assert await cluster.holders(sha) == ["cp1", "cp2"]


async def test_an_import_with_no_live_peer_answers_at_once_with_one_copy_of_two(cluster: Cluster) -> None:
    cp1 = cluster.plane("cp1")
    cluster.plane("cp2")
    cluster.away("cp2")
    sha = await cluster.imported("cp1", b"weights")
    answer = await cp1.acknowledge(sha)
    assert (answer.copies, answer.wanted) == (("cp1",), 2)
    assert "no other control plane is live yet; peers will pull it" in answer.note


async def test_an_import_answers_once_a_live_peer_has_pulled_it(cluster: Cluster) -> None:
    cp1, cp2 = cluster.plane("cp1"), cluster.plane("cp2")
    sha = await cluster.imported("cp1", b"weights")
    acknowledging = asyncio.create_task(cp1.acknowledge(sha))
    await eventually(lambda: cluster.clock.sleepers == 1, message="the import waits for its copies")
    assert not acknowledging.done()
    await cp2.sync()
    await cluster.clock.advance(INTERVAL_S)
    answer = await asyncio.wait_for(acknowledging, 5)
    assert (answer.copies, answer.wanted) == (("cp1", "cp2"), 2)
    assert answer.note == "held by 2 control planes (cp1, cp2)"


async def test_an_import_waits_no_longer_than_ack_wait_s(cluster: Cluster) -> None:
    cp1 = cluster.plane("cp1", ack_wait_s=10)
    cluster.plane("cp2")
    sha = await cluster.imported("cp1", b"weights")
    acknowledging = asyncio.create_task(cp1.acknowledge(sha))
    for _ in range(5):
        await eventually(lambda: cluster.clock.sleepers == 1, message="the import waits for its copies")
        await cluster.clock.advance(INTERVAL_S)
    answer = await asyncio.wait_for(acknowledging, 5)
    assert (answer.copies, answer.wanted) == (("cp1",), 2)
    assert "cp2 still pulling it" in answer.note


async def test_with_one_plane_an_import_wants_one_copy(cluster: Cluster) -> None:
    cp1 = cluster.plane("cp1")
    sha = await cluster.imported("cp1", b"weights")
    answer = await cp1.acknowledge(sha)
    assert (answer.copies, answer.wanted) == (("cp1",), 1)


async def test_a_pull_failing_the_same_way_is_logged_once(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cp1, cp2 = cluster.plane("cp1"), cluster.plane("cp2")
    sha = await cluster.imported("cp1", b"weights")
    await cp1.sync()
    cluster.network.mirrors.pop("cp1:8443")  # cp1 answers that it lacks the blob
    with caplog.at_level(logging.INFO, logger="llmgw.controlplane.mirror.replicating"):
        assert await cp2.sync() == 0
        assert await cp2.sync() == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "could not pull blob" in warnings[0].getMessage()
    assert len([r for r in caplog.records if "pulling 1 blobs" in r.getMessage()]) == 1
    assert await cluster.holders(sha) == ["cp1"]
