"""The gateway's one inbound interface (``gateway.feed``): replicas, catalog, keys, KV blocks, stopped."""

from __future__ import annotations

from llmgw.core.catalog import ModelDefinition, parse_model
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.gateway import Gateway, KeyEntry, ReplicaEndpoint, hash_secret
from llmgw.gateway.usage import UsageRecord
from llmgw.testing.gateway_doubles import RecordingOutbound

SHA = "0123456789abcdef" * 4


def endpoint(replica_id: str, model: str = "m") -> ReplicaEndpoint:
    return ReplicaEndpoint(replica_id, model, f"http://127.0.0.1:1/{replica_id}", "k", capacity=2)


def model_with_adapter() -> list[ModelDefinition]:
    return [
        parse_model(
            {
                "name": "m",
                "source": {"sha256": SHA},
                "adapters": [{"name": "m-sql", "sha256": SHA}],
            }
        )
    ]


def test_a_ready_replica_is_routed_to_and_a_gone_one_no_more() -> None:
    gateway = Gateway()
    gateway.feed.replica_ready(endpoint("r1"), {"m-sql": "/data/sql"})
    assert gateway.replicas.pick("m") == endpoint("r1")
    gateway.feed.replica_gone("r1")
    assert gateway.replicas.pick("m") is None


def test_the_catalog_replaced_lists_its_models_and_their_adapters() -> None:
    gateway = Gateway()
    gateway.feed.catalog_replaced(model_with_adapter())
    assert "m" in gateway.catalog
    assert gateway.feed.served_model("m-sql") == "m"
    assert gateway.feed.served_model("m") == "m"


def test_replaced_keys_are_the_only_valid_ones() -> None:
    gateway = Gateway()
    gateway.feed.keys_replaced([KeyEntry(key_id="k1", name="a", secret_hash=hash_secret("sk-1"))])
    assert gateway.keys.lookup("sk-1") is not None
    gateway.feed.keys_replaced([])
    assert gateway.keys.lookup("sk-1") is None


def test_kv_blocks_reach_the_routers_index_and_a_reset_clears_the_replicas_blocks() -> None:
    gateway = Gateway()
    gateway.feed.replica_ready(endpoint("r1"))
    gateway.feed.kv_blocks(KvBlocksUpdate(model="m", replica_id="r1", stored=(1, 2, 3), hash_seed="0"))
    gateway.feed.kv_blocks(KvBlocksUpdate(model="m", replica_id="r1", removed=(3,)))
    kv = gateway.replicas.router.kv
    assert kv.held("r1") == 2
    gateway.feed.kv_blocks(KvBlocksUpdate(model="m", replica_id="r1", stored=(7,), reset=True))
    assert kv.leading([7], ["r1"]) == {"r1": 1} and kv.held("r1") == 1


def test_in_flight_counts_the_requests_on_a_models_ready_replicas() -> None:
    gateway = Gateway()
    gateway.feed.replica_ready(endpoint("r1"))
    gateway.feed.replica_ready(endpoint("r2"))
    with gateway.replicas.acquire(endpoint("r1")), gateway.replicas.acquire(endpoint("r2")):
        assert gateway.feed.in_flight("m") == 2
    assert gateway.feed.in_flight("m") == 0


def test_stopped_is_the_gateways_own_flag() -> None:
    gateway = Gateway()
    gateway.feed.set_stopped(True)
    assert gateway.stopped
    gateway.feed.set_stopped(False)
    assert not gateway.stopped


def test_an_adapters_usage_keeps_its_base_model_in_use() -> None:
    outbound = RecordingOutbound()
    gateway = Gateway(outbound=outbound)
    gateway.feed.catalog_replaced(model_with_adapter())
    gateway.telling.request_ended(UsageRecord("k1", "m-sql", "r1", 1, 1, 200, 0.1))
    assert outbound.used == ["m"]


def test_a_draining_replica_takes_no_new_request_and_its_load_stays_readable() -> None:
    gateway = Gateway()
    gateway.feed.replica_ready(endpoint("r1"))
    gateway.feed.replica_ready(endpoint("r2"))
    lease = gateway.replicas.acquire(endpoint("r1"))
    gateway.feed.replica_draining("r1")
    assert {gateway.replicas.pick("m") for _ in range(4)} == {endpoint("r2")}
    assert gateway.feed.replica_in_flight("r1") == 1
    assert gateway.feed.model_load("m").ready == 1
    lease.release()
    assert gateway.feed.replica_in_flight("r1") == 0


def test_the_time_to_first_token_of_an_adapters_request_counts_for_its_base_model() -> None:
    gateway = Gateway()
    gateway.feed.catalog_replaced(model_with_adapter())
    gateway.telling.request_ended(UsageRecord("k1", "m-sql", "r1", 1, 1, 200, 0.5, ttft_s=0.2))
    whole = UsageRecord("k1", "m", "r1", 1, 1, 200, 0.5)  # a whole answer: no first token
    gateway.telling.request_ended(whole)
    assert gateway.feed.model_load("m").ttft_ms == 200
