"""The state protocol's one codec: every event round-trips, frames of the previous release are read, and
a frame that cannot be read raises BadFrame saying what was wrong with it."""

from __future__ import annotations

import json
import typing

import pytest

from llmgw.controlplane.statesharing import stateevents
from llmgw.controlplane.statesharing.stateevents import (
    VERSION,
    BadFrame,
    CatalogReplaced,
    Copy,
    Counted,
    Event,
    Hello,
    InFlight,
    KeysReplaced,
    KvBlocks,
    LimitsCounted,
    LimitsReplaced,
    LimitsShared,
    Live,
    Metrics,
    PricesReplaced,
    QueuedElsewhere,
    ReplicaDraining,
    ReplicaFailed,
    ReplicaGone,
    ReplicaReady,
    SendMetrics,
    Serves,
    StoppedSet,
    Usage,
    UsageSummed,
    Used,
    Wanted,
    decode,
    encode,
)
from llmgw.core.catalog import parse_model
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.limits import Limits
from llmgw.core.limitshares import divide
from llmgw.core.pricing import Price, Prices
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import KeyEntry, ReplicaEndpoint, hash_secret
from llmgw.gateway.usage import UsageRecord

SHA = "0123456789abcdef" * 4

EXAMPLES: list[Event] = [
    ReplicaReady(ReplicaEndpoint("r1", "m", "http://10.0.0.2:8000", "rk", 4, "llamacpp"), {"m-sql": "/a"}),
    ReplicaGone("r1"),
    ReplicaDraining("r2"),
    CatalogReplaced((parse_model({"name": "m", "source": {"sha256": SHA}}),)),
    KeysReplaced(
        (
            KeyEntry(
                "k1",
                "ann's",
                hash_secret("sk-1"),
                "ann",
                Place(Owner.parse("user:ann"), frozenset({Owner.parse("team:acme/ml")})),
                ("handbook",),
            ),
            KeyEntry("k2", "k2", hash_secret("sk-2")),
        )
    ),
    LimitsReplaced(
        {
            "key:k1": Limits(requests_per_minute=5, models=frozenset({"m", "e"})),
            "project:acme/ml/chat": Limits(priority=8),
        }
    ),
    LimitsShared(divide(["cp1", "cp2"], {"cp2": {"key:k1": 4.0}})),
    PricesReplaced(
        Prices({"m": Price(input=0.5, cached_input=0.05, output=1.5), "img": Price(picture=0.02)}, "EUR")
    ),
    LimitsCounted({"key:k1": (10, 20)}),
    KvBlocks(
        KvBlocksUpdate("m", "r1", stored=(1, 2), removed=(3,), reset=True, hash_seed="0", block_size=16)
    ),
    StoppedSet(True),
    Copy(("r1", "r2")),
    Live(),
    Serves(False),
    SendMetrics(),
    QueuedElsewhere({"m": 2}),
    Wanted("m"),
    Used("m"),
    ReplicaFailed("r1", "connection refused"),
    Usage(UsageRecord("k1", "m", "r1", 3, 4, 200, 0.5, place="user:ann", ttft_s=0.1, generation_s=0.3)),
    UsageSummed((("k1", "m", "", 2, 0, 6, 8, 1.0, 0, 0.0, 1.0),)),
    Counted({"key:k1": 12}, "cp2"),
    Hello(4242),
    InFlight({"m": 2}, {"r1": 2}, {"m": {"project:acme/ml/chat": 3, "": 1}}, {"m": 0.25}),
    Metrics((["llmgw_gateway_requests_total", {"model": "m"}, 7.0],)),
]


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: e.kind)
def test_every_event_round_trips_as_one_line_of_compact_json(event: Event) -> None:
    frame = encode(event)
    assert b"\n" not in frame
    assert json.loads(frame)["v"] == VERSION
    assert decode(frame) == event


def test_the_examples_cover_every_kind_of_event() -> None:
    assert {type(e) for e in EXAMPLES} == set(typing.get_args(Event))
    assert len({e.kind for e in EXAMPLES}) == len(EXAMPLES)


def test_frames_of_the_release_before_versions_are_read() -> None:
    """That release sent no ``v``, and its workers (left serving across a restart) named a worker's
    counted tokens ``used``; its standbys sent no plane."""
    assert decode(b'{"kind":"wanted","model":"m"}') == Wanted("m")
    assert decode(b'{"kind":"counted","used":{"key:k1":"40"}}') == Counted({"key:k1": 40})
    assert decode(b'{"kind":"counted","tokens":{"key:k1":1}}') == Counted({"key:k1": 1}, "")
    key = {"key_id": "k", "name": "k", "secret_hash": "h", "owner": None, "at": "", "memberships": []}
    keys = decode(json.dumps({"kind": "keys_replaced", "keys": [key]}).encode())  # no collections yet
    assert isinstance(keys, KeysReplaced) and keys.keys[0].collections == ()
    old = b'{"kind":"in_flight","models":{"m":1},"replicas":{"r1":1}}'  # no flow queues yet
    assert decode(old) == InFlight({"m": 1}, {"r1": 1}, {}, {})


def test_what_this_release_writes_is_what_the_previous_one_read() -> None:
    """The fields stay those of the release before versions were stated, so that it reads these."""
    assert json.loads(encode(ReplicaFailed("r1", "gone"))) == {
        "v": 1,
        "kind": "replica_failed",
        "replica_id": "r1",
        "reason": "gone",
    }
    assert json.loads(encode(LimitsCounted({"s": (1, 2)}))) == {
        "v": 1,
        "kind": "limits_counted",
        "used": {"s": [1, 2]},
    }
    update = json.loads(encode(KvBlocks(KvBlocksUpdate("m", "r1", stored=(1,), mismatch="seed"))))["update"]
    assert set(update) == {"model", "replica_id", "stored", "removed", "reset", "hash_seed", "block_size"}


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"{not json", "is not JSON"),
        (b"\xff\xfe", "is not JSON"),
        (b'["kind", "wanted"]', "holds no JSON object"),
        (b'{"v": 2, "kind": "wanted", "model": "m"}', "protocol version 2; this side speaks up to 1"),
        (b'{"v": "one", "kind": "wanted"}', "names no protocol version but 'one'"),
        (b'{"kind": "write_the_store"}', "unknown kind 'write_the_store'; known: catalog_replaced, copy"),
        (b'{"model": "m"}', "unknown kind None"),
        (b'{"kind": "wanted"}', "a 'wanted' frame lacks its field 'model'"),
        (b'{"kind": "wanted", "model": 7}', "'wanted' frame has a field that is wrong: model is text, not 7"),
        (b'{"kind": "usage_sums", "sums": {"k1": 2}}', "sums is a list"),
        (b'{"kind": "usage_sums", "sums": [[1, 2]]}', "a usage sum has 14 fields"),
        (b'{"kind": "usage", "record": {"key_id": "k", "tokens": 1}}', "unknown fields ['tokens']"),
        (b'{"kind": "hello", "pid": true}', "pid is a whole number, not True"),
        (
            b'{"kind": "limits_counted", "used": {"s": [1]}}',
            "'limits_counted' frame has a field that is wrong",
        ),
        (b'{"kind": "replica_ready", "endpoint": {"replica_id": "r1"}}', "lacks its field 'model'"),
        (b'{"kind": "catalog_replaced", "models": [{"name": 3}]}', "'catalog_replaced' frame has a field"),
        (b'{"kind": "limits_replaced", "limits": {"s": {"rpm": 1}}}', "unknown limits ['rpm']"),
        (b'{"kind": "in_flight", "models": {"m": "x"}, "replicas": {}}', "'in_flight' frame has a field"),
    ],
)
def test_a_frame_that_cannot_be_read_says_what_was_wrong(frame: bytes, says: str) -> None:
    with pytest.raises(BadFrame) as raised:
        decode(frame)
    assert says in raised.value.message
    assert raised.value.hint


def test_only_events_are_encoded() -> None:
    with pytest.raises(TypeError, match="no event of the state protocol"):
        encode({"kind": "wanted", "model": "m"})  # type: ignore[arg-type]
    assert stateevents.VERSION == 1
