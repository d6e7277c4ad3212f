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
    for replica in ("r1", "r2", "r3"):
        router.set_block_hashing(replica, "m", "0", 4)
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
    for replica in ("r1", "r2", "r3"):
        table.router.set_block_hashing(replica, "m", "0", 4)
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


def test_a_new_shared_prefix_goes_where_fewer_are_cached_even_if_busier() -> None:
    table = _table("prefix", replicas=2, capacity=4)
    by_group = {}
    for group in range(3):  # r0 and r1 hold one or two groups
        endpoint = table.pick("m", prompt=f"group {group} " + SYSTEM)
        assert endpoint is not None
        by_group[group] = endpoint
    fewer = next(e for e in (by_group[0], by_group[1]) if list(by_group.values()).count(e) == 1)
    leases = [table.acquire(fewer) for _ in range(3)]  # busier (0.75), not saturated
    chosen = table.pick("m", prompt="group 3 " + SYSTEM)
    assert chosen == fewer  # the cache's share of hot prefixes outweighs a transient load
    for lease in leases:
        lease.release()


def test_with_many_unshared_prompts_load_decides_a_new_one() -> None:
    table = _table("prefix", replicas=2, capacity=4)
    endpoints = {}
    for n in range(201):  # unshared prompts: r0 and r1 each hold about a hundred
        endpoint = table.pick("m", prompt=f"{n} unique question " + "in many words " * 10)
        assert endpoint is not None
        endpoints[endpoint.replica_id] = endpoint
    idle, busy = endpoints["r0"], endpoints["r1"]
    counts = table.router.tree("m").roots
    if counts["r0"] < counts["r1"]:
        idle, busy = busy, idle  # the idle one holds more prefixes
    leases = [table.acquire(busy) for _ in range(3)]
    assert table.pick("m", prompt="a question never asked " + "in many words " * 10) == idle
    for lease in leases:
        lease.release()


def test_the_same_prompt_under_another_cache_salt_shares_no_prefix() -> None:
    """Two teams' requests with the same text (their collections' salts differ) are not kept together
    for a cache they cannot share; the same team's are; a request without a salt keeps today's keys."""
    table = _table("prefix", replicas=8, capacity=8)
    team_a = "kb-" + "a" * 32
    first = table.pick("m", prompt=SYSTEM + "one", salt=team_a)
    assert first is not None
    tree = table.router.tree("m")
    assert tree.match(SYSTEM, salt=team_a)[0] == {first.replica_id: len(SYSTEM) // 128}
    assert tree.match(SYSTEM, salt="kb-" + "b" * 32)[0] == {}
    assert tree.match(SYSTEM)[0] == {}
    assert table.pick("m", prompt=SYSTEM + "two", salt=team_a) == first
    plain = table.pick("m", prompt=SYSTEM + "three")
    assert plain is not None
    assert tree.match(SYSTEM)[0] == {plain.replica_id: len(SYSTEM) // 128}


def test_kv_keys_of_a_salted_prompt_are_the_engines_salted_blocks() -> None:
    table = _table("kv")
    router = table.router
    for replica in ("r1", "r2", "r3"):
        router.set_block_hashing(replica, "m", "0", 4)
    tokens = list(range(40))
    salt = "kb-" + "c" * 32
    router.kv.stored("r1", BlockHasher("0", 4).keys(tokens, salt)[:6])  # what r1's engine published
    router.kv.stored("r3", BlockHasher("0", 4).keys(tokens)[:8])  # the same text, unsalted
    chosen = table.pick("m", prompt="anything", tokens=tokens, salt=salt)
    assert chosen is not None and chosen.replica_id == "r1"
    chosen = table.pick("m", prompt="anything", tokens=tokens)
    assert chosen is not None and chosen.replica_id == "r3"


def test_each_replica_is_matched_with_the_block_size_its_engine_reports() -> None:
    table = _table("kv")
    router = table.router
    router.set_block_hashing("r1", "m", "0", 128)  # vLLM's CPU backend
    router.set_block_hashing("r2", "m", "0", 16)
    tokens = list(range(600))
    router.kv.stored("r1", BlockHasher("0", 128).keys(tokens))  # the whole prompt: 4 blocks of 128
    router.kv.stored("r2", BlockHasher("0", 16).keys(tokens)[:8])  # its first 128 tokens
    assert (router.block_size("r1"), router.block_size("r2"), router.block_size("r0")) == (128, 16, 0)
    before = _count("kv")
    chosen = table.pick("m", prompt="anything", tokens=tokens)
    assert chosen is not None and chosen.replica_id == "r1" and _count("kv") == before + 1
    router.set_block_hashing("r1", "m", "0", 16)  # hashed at 16, r1's blocks of 128 never match
    chosen = table.pick("m", prompt="anything", tokens=tokens)
    assert chosen is not None and chosen.replica_id == "r2"
    router.set_block_hashing("r2", "m", "0", 0)  # r2's size unknown again (its engine restarted)
    router.set_block_hashing("r1", "m", "0", 0)
    assert not router.wants_tokens("m")


def test_a_replica_whose_hashes_disagree_is_counted_until_they_agree_or_it_goes() -> None:
    from prometheus_client import REGISTRY

    table = _table("kv")
    router = table.router
    router.set_block_hashing("r1", "m", "0", 16, mismatch="none of the 4 blocks checked agree")
    assert router.mismatched == {"r1": "none of the 4 blocks checked agree"}
    assert REGISTRY.get_sample_value("llmgw_kv_replicas_mismatched") == 1
    router.set_block_hashing("r1", "m", "0", 16)
    assert not router.mismatched
    router.set_block_hashing("r2", "m", "0", 16, mismatch="why")
    table.remove("r2")
    assert not router.mismatched and router.block_size("r2") == 0
