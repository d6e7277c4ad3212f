"""The router's policies: round robin, least loaded, prefix tree, KV blocks; saturation overrides."""

from __future__ import annotations

from llmgw.core.kvblocks import BlockHasher
from llmgw.gateway.replicas import ReplicaEndpoint, ReplicaTable
from llmgw.gateway.routing import DECISIONS, Router, RoutingSettings

SYSTEM = "You are a careful assistant. " * 40


def _table(policy: str, replicas: int = 4, capacity: int = 2) -> ReplicaTable:
    table = ReplicaTable(Router(RoutingSettings(policy=policy)))  # type: ignore[arg-type]
    for i in range(replicas):
        table.set_ready(ReplicaEndpoint(f"r{i}", "m", f"http://127.0.0.1:{9000 + i}", "k", capacity))
    return table


def _count(kind: str) -> float:
    return DECISIONS.labels(kind)._value.get()  # type: ignore[no-any-return]


def test_round_robin_visits_every_replica() -> None:
    table = _table("round-robin")
    chosen = [table.pick("m", prompt=SYSTEM) for _ in range(4)]
    assert {e.replica_id for e in chosen if e is not None} == {"r0", "r1", "r2", "r3"}


def test_prefix_policy_keeps_a_shared_prompt_on_one_replica_until_saturated() -> None:
    table = _table("prefix", capacity=2)
    before = _count("tree")
    first = table.pick("m", prompt=SYSTEM + "user one")
    assert first is not None
    leases = [table.acquire(first)]
    again = table.pick("m", prompt=SYSTEM + "user two")
    assert again == first and _count("tree") == before + 1
    leases += [table.acquire(first), table.acquire(first)]  # 3 of 2: saturated (1.5)
    saturated = _count("saturated")
    elsewhere = table.pick("m", prompt=SYSTEM + "user three")
    assert elsewhere is not None and elsewhere != first
    assert _count("saturated") == saturated + 1
    for lease in leases:
        lease.release()
    assert table.pick("m", prompt=SYSTEM + "user four") in (first, elsewhere)


def test_kv_policy_goes_where_the_leading_blocks_are() -> None:
    table = _table("kv")
    router = table.router
    router.set_block_hashing("m", "0", 4)
    tokens = list(range(40))
    keys = BlockHasher("0", 4).keys(tokens)
    router.kv.stored("r2", keys[:6])
    router.kv.stored("r3", keys[:2])
    assert router.wants_tokens("m")
    before = _count("kv")
    chosen = table.pick("m", prompt="anything", tokens=tokens)
    assert chosen is not None and chosen.replica_id == "r2" and _count("kv") == before + 1
    table.remove("r2")  # its blocks go with it
    chosen = table.pick("m", prompt="anything", tokens=tokens)
    assert chosen is not None and chosen.replica_id == "r3"


def test_kv_policy_falls_back_to_the_tree_when_no_block_is_known() -> None:
    table = _table("kv")
    table.router.set_block_hashing("m", "0", 4)
    first = table.pick("m", prompt=SYSTEM, tokens=[1, 2, 3, 4])
    before = _count("tree")
    assert table.pick("m", prompt=SYSTEM, tokens=[1, 2, 3, 4]) == first
    assert _count("tree") == before + 1


def test_least_loaded_ignores_the_prompt() -> None:
    table = _table("least-loaded", replicas=2, capacity=1)
    first = table.pick("m", prompt=SYSTEM)
    assert first is not None
    with table.acquire(first):
        second = table.pick("m", prompt=SYSTEM)
    assert second is not None and second != first


def test_new_prefixes_spread_over_the_replicas() -> None:
    table = _table("prefix", replicas=4)
    chosen = set()
    for group in range(4):
        endpoint = table.pick("m", prompt=f"group {group} " + SYSTEM)
        assert endpoint is not None
        chosen.add(endpoint.replica_id)
        assert table.pick("m", prompt=f"group {group} " + SYSTEM + " again") == endpoint
    assert chosen == {"r0", "r1", "r2", "r3"}  # no replica caches two groups while another has none
