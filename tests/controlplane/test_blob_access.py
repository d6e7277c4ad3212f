"""Blob access: a peer pulls any blob; a node only its replicas' files, on the leader and on a standby."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controlplane.mirror.blobaccess import BlobAccess
from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.core.relays import RelayPeer
from llmgw.core.tenancy import CLUSTER
from llmgw.errors import Unauthorized
from llmgw.store.database import Store
from llmgw.store.replicas import ReplicaRecord
from llmgw.testing.admin import empty_fleet

WEIGHTS = "ab" * 32
ADAPTER = "cd" * 32
OTHER = "ef" * 32
NODE = RelayPeer("node1", control_plane=False)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    definition = {
        "name": "m1",
        "source": {"sha256": WEIGHTS, "filename": "m.gguf", "size": 10},
        "adapters": [{"name": "a1", "sha256": ADAPTER, "size": 5}],
    }
    await opened.models.add("m1", definition)
    await opened.models.add(
        "m2", {"name": "m2", "source": {"sha256": OTHER, "filename": "o.gguf", "size": 10}}
    )
    await opened.replicas.add(ReplicaRecord("r1", "m1", "node1", "key", (), 100))
    yield opened
    await opened.close()


async def test_a_standby_lets_a_node_fetch_the_files_of_the_replicas_placed_on_it(store: Store) -> None:
    access = BlobAccess(store, empty_fleet(), leading=lambda: False)
    await access.check(NODE, WEIGHTS)
    await access.check(NODE, ADAPTER)
    with pytest.raises(Unauthorized, match="node node1 runs no replica with the file efefefefefef"):
        await access.check(NODE, OTHER)


async def test_a_control_planes_certificate_pulls_any_blob(store: Store) -> None:
    access = BlobAccess(store, empty_fleet(), leading=lambda: True)
    await access.check(RelayPeer("cp2", control_plane=True), OTHER)


async def test_the_leader_answers_from_its_fleet(store: Store) -> None:
    fleet: Fleet = empty_fleet()
    access = BlobAccess(store, fleet, leading=lambda: True)
    with pytest.raises(Unauthorized):
        await access.check(NODE, WEIGHTS)  # the store places it, but the leader goes by its own memory
    fleet.track(ReplicaState("r9", "m2", "node1", "key", blobs=frozenset({OTHER})))
    await access.check(NODE, OTHER)


async def test_a_node_certificate_named_like_a_control_plane_gets_nothing_extra(store: Store) -> None:
    access = BlobAccess(store, empty_fleet(), leading=lambda: False)
    with pytest.raises(Unauthorized):
        await access.check(RelayPeer("cp2", control_plane=False), OTHER)


async def test_a_node_fetches_the_base_files_of_a_training_job_placed_on_it_only(store: Store) -> None:
    base = "12" * 32
    spec = {"device_kind": "cpu", "weights": [{"sha256": base, "filename": "model.safetensors", "size": 1}]}
    job = await store.training.add(
        owner=CLUSTER, model="m1", node="any", memory_mb=1, retry=0, spec=spec, pairs=b"{}"
    )
    for leading in (True, False):
        access = BlobAccess(store, empty_fleet(), leading=lambda leading=leading: leading)
        with pytest.raises(Unauthorized):
            await access.check(NODE, base)  # queued: on no node yet
    await store.training.change(job.id, state="placed", node_id="node1", device="cpu", attempt=1)
    for leading in (True, False):
        access = BlobAccess(store, empty_fleet(), leading=lambda leading=leading: leading)
        await access.check(NODE, base)
        with pytest.raises(Unauthorized):
            await access.check(RelayPeer("node2", control_plane=False), base)
    await store.training.change(job.id, state="succeeded")
    with pytest.raises(Unauthorized):
        await BlobAccess(store, empty_fleet(), leading=lambda: True).check(NODE, base)
