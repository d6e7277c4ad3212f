"""The cluster's state as metrics: nodes, replicas by model and state, leadership, reconciling, the store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from sqlalchemy import text

from llmgw.controlplane.metrics.clustermetrics import observe_pass, register_cluster, watch_store
from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.devices import NodeInventory
from llmgw.core.nodes import NodeRegistration
from llmgw.core.shards import ReplicaPhase
from llmgw.store.database import Store
from llmgw.testing.eventually import eventually


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}")
    yield opened
    await opened.close()


def fleet_of(*replicas: tuple[str, str, ReplicaPhase], nodes: tuple[str, ...] = ()) -> Fleet:
    fleet = Fleet(on_ready=lambda replica, url: None, on_gone=lambda replica_id: None)
    for node in nodes:
        fleet.attach(NodeRegistration(NodeInventory(node, "127.0.0.1", 4, 8192)), object())  # type: ignore[arg-type]
    for replica_id, model, state in replicas:
        fleet.track(ReplicaState(replica_id, model, "n1", api_key="k", state=state))
    return fleet


def test_nodes_and_replicas_by_model_and_state_are_read_when_scraped() -> None:
    registry = CollectorRegistry()
    fleet = fleet_of(
        ("r1", "chat", ReplicaPhase.READY),
        ("r2", "chat", ReplicaPhase.READY),
        ("r3", "chat", ReplicaPhase.STARTING),
        ("r4", "embed", ReplicaPhase.FAILED),
        nodes=("n1", "n2"),
    )
    register_cluster(fleet, SimpleNamespace(leading=True, epoch=7), registry)

    assert registry.get_sample_value("llmgw_nodes_connected") == 2
    assert registry.get_sample_value("llmgw_replicas", {"model": "chat", "state": "ready"}) == 2
    assert registry.get_sample_value("llmgw_replicas", {"model": "chat", "state": "starting"}) == 1
    assert registry.get_sample_value("llmgw_replicas", {"model": "embed", "state": "failed"}) == 1

    fleet.forget("r4")
    assert registry.get_sample_value("llmgw_replicas", {"model": "embed", "state": "failed"}) is None


def leader(registry: CollectorRegistry) -> tuple[float | None, float | None]:
    return registry.get_sample_value("llmgw_leader"), registry.get_sample_value("llmgw_lease_epoch")


def test_the_leader_reports_its_lease_epoch_and_a_standby_none() -> None:
    registry = CollectorRegistry()
    leadership = SimpleNamespace(leading=True, epoch=7)
    register_cluster(fleet_of(), leadership, registry)
    assert (registry.get_sample_value("llmgw_leader"), registry.get_sample_value("llmgw_lease_epoch")) == (
        1,
        7,
    )

    leadership.leading, leadership.epoch = False, None
    assert (registry.get_sample_value("llmgw_leader"), registry.get_sample_value("llmgw_lease_epoch")) == (
        0,
        0,
    )


def test_unregistering_takes_the_cluster_metrics_away() -> None:
    registry = CollectorRegistry()
    undo = register_cluster(fleet_of(), SimpleNamespace(leading=False, epoch=None), registry)
    undo()
    assert registry.get_sample_value("llmgw_leader") is None


async def test_store_statements_are_timed_and_failures_counted(store: Store) -> None:
    watch_store(store.engine)
    timed = REGISTRY.get_sample_value("llmgw_store_query_duration_seconds_count") or 0.0
    failed = REGISTRY.get_sample_value("llmgw_store_errors_total") or 0.0

    async with store.engine.connect() as connection:
        await connection.execute(text("SELECT 1"))
        with pytest.raises(Exception, match="no such table"):
            await connection.execute(text("SELECT * FROM no_such_table"))

    assert REGISTRY.get_sample_value("llmgw_store_query_duration_seconds_count") == timed + 1
    assert REGISTRY.get_sample_value("llmgw_store_errors_total") == failed + 1


async def test_each_reconcile_pass_is_timed(store: Store) -> None:
    passes: list[float] = []
    before = REGISTRY.get_sample_value("llmgw_reconcile_duration_seconds_count") or 0.0

    def on_pass(seconds: float) -> None:
        passes.append(seconds)
        observe_pass(seconds)

    reconciler = Reconciler(store, fleet_of(), interval_s=0.01, on_pass=on_pass)
    task = asyncio.create_task(reconciler.run(may_act=lambda: True))
    try:
        await eventually(lambda: len(passes) >= 2, message="two reconcile passes")
    finally:
        task.cancel()
    assert all(seconds > 0 for seconds in passes)
    assert (REGISTRY.get_sample_value("llmgw_reconcile_duration_seconds_count") or 0.0) - before >= 2
