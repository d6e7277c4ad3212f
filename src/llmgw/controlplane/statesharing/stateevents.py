"""The state protocol's events, one frozen dataclass per kind of change, and its one codec.

One protocol carries a gateway's state from a server to its followers: from
the leader to each standby control plane (gRPC, ``controlplane/statesharing/statestream.py``)
and from a control plane to each of its gateway workers (a Unix socket,
``controlplane/statesharing/localchannel.py``). Its events go:

- **server to follower** — a full copy (:class:`Copy`, then the state's
  :data:`StateChange` s, then :class:`Live`), then every change; to a worker
  also :class:`Serves` and :class:`SendMetrics`;
- **follower to server** — its requests (:data:`Request`): what only the
  server decides or writes (:class:`Wanted`, :class:`Used`, :class:`Usage`,
  :class:`UsageSummed`, :class:`Counted`, :class:`ReplicaFailed`) and, from a
  worker, what its control plane sums (:class:`Hello`, :class:`InFlight`,
  :class:`Metrics`).

:func:`encode` and :func:`decode` are the only places that know the frames:
one compact JSON object, ``{"v": VERSION, "kind": ..., fields}``, with no
newline in it (the Unix socket carries one frame a line). The fields are
those of the release before versions were stated, which sent no ``v``: a
frame without one is read as version 1, and that release reads this one's, so
a standby or an inherited gateway worker of the previous release still
follows. A frame that cannot be read raises :class:`BadFrame`, naming the
kind and the field that was wrong: a server logs it and drops the frame; a
follower ends its stream and takes a new full copy.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from pydantic import ValidationError

from llmgw.controlplane.accounting.usage_writing import SUM_FIELDS
from llmgw.core.catalog import ModelDefinition
from llmgw.core.engines import DEFAULT_ENGINE
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.limits import Limits
from llmgw.core.limitshares import PlaneShares
from llmgw.core.pricing import Prices
from llmgw.core.tenancy import Owner, Place
from llmgw.errors import LlmgwError
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.usage import UsageRecord

VERSION = 1
"""The protocol version this side speaks (and every one below it)."""


class BadFrame(LlmgwError):
    """A frame of the state protocol that cannot be read: the message says what was wrong with it."""


# -- server to follower: the state --------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaReady:
    kind: ClassVar[str] = "replica_ready"
    endpoint: ReplicaEndpoint
    adapter_paths: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Adapter name -> its file on the replica's node."""


@dataclass(frozen=True)
class ReplicaGone:
    kind: ClassVar[str] = "replica_gone"
    replica_id: str


@dataclass(frozen=True)
class ReplicaDraining:
    kind: ClassVar[str] = "replica_draining"
    replica_id: str


@dataclass(frozen=True)
class CatalogReplaced:
    kind: ClassVar[str] = "catalog_replaced"
    models: tuple[ModelDefinition, ...]


@dataclass(frozen=True)
class KeysReplaced:
    kind: ClassVar[str] = "keys_replaced"
    keys: tuple[KeyEntry, ...]


@dataclass(frozen=True)
class LimitsReplaced:
    kind: ClassVar[str] = "limits_replaced"
    limits: Mapping[str, Limits]


@dataclass(frozen=True)
class PricesReplaced:
    kind: ClassVar[str] = "prices_replaced"
    prices: Prices


@dataclass(frozen=True)
class LimitsShared:
    kind: ClassVar[str] = "limits_shared"
    shares: PlaneShares


@dataclass(frozen=True)
class LimitsCounted:
    kind: ClassVar[str] = "limits_counted"
    used: Mapping[str, tuple[int, int]]
    """Per subject, the tokens spent this UTC day and month."""


@dataclass(frozen=True)
class KvBlocks:
    kind: ClassVar[str] = "kv_blocks"
    update: KvBlocksUpdate


@dataclass(frozen=True)
class StoppedSet:
    kind: ClassVar[str] = "set_stopped"
    stopped: bool


@dataclass(frozen=True)
class Copy:
    """Starts a full copy: the follower forgets the replicas it does not name."""

    kind: ClassVar[str] = "copy"
    replica_ids: tuple[str, ...]


@dataclass(frozen=True)
class Live:
    """Ends a full copy: the follower now holds the server's whole state."""

    kind: ClassVar[str] = "live"


# -- server to a gateway worker -----------------------------------------------------------------------


@dataclass(frozen=True)
class Serves:
    """Whether the control plane serves ``/v1`` itself (it leads, or holds a leader's copy)."""

    kind: ClassVar[str] = "serves"
    serves: bool


@dataclass(frozen=True)
class QueuedElsewhere:
    """To a worker with a flow queue: how many flows wait for each model in its plane's other
    workers' queues (``gateway/queueing.py``: it keeps its share of the slots while they wait)."""

    kind: ClassVar[str] = "queued_elsewhere"
    flows: Mapping[str, int]


@dataclass(frozen=True)
class SendMetrics:
    """Asks a worker for its gateway metric samples now (a scrape of ``/metrics`` is waiting)."""

    kind: ClassVar[str] = "send_metrics"


# -- follower to server: requests ---------------------------------------------------------------------


@dataclass(frozen=True)
class Wanted:
    """A request came for ``model``, which has no replica: start one (on demand)."""

    kind: ClassVar[str] = "wanted"
    model: str


@dataclass(frozen=True)
class Used:
    """``model`` was used since the last tick (an on-demand model is kept)."""

    kind: ClassVar[str] = "used"
    model: str


@dataclass(frozen=True)
class ReplicaFailed:
    kind: ClassVar[str] = "replica_failed"
    replica_id: str
    reason: str


@dataclass(frozen=True)
class Usage:
    """One request's usage (a plane that leads does its own gateway's at once; followers send sums)."""

    kind: ClassVar[str] = "usage"
    record: UsageRecord


@dataclass(frozen=True)
class UsageSummed:
    """Usage summed per key, model and place since the last tick (``usage_writing.UsageSums`` rows)."""

    kind: ClassVar[str] = "usage_sums"
    sums: tuple[tuple[Any, ...], ...]

    def rows(self) -> list[list[Any]]:
        """The sums as the usage writer takes them."""
        return [list(row) for row in self.sums]


@dataclass(frozen=True)
class Counted:
    """Tokens counted against limits since the last report: a standby's, handed to the leader (which
    writes them), or a worker's, added to its control plane's meters."""

    kind: ClassVar[str] = "counted"
    tokens: Mapping[str, int]
    plane: str = ""
    """The standby that counted them (empty from a worker, and from a standby of an earlier release)."""


@dataclass(frozen=True)
class Hello:
    """A worker's first frame on each connection: who it is (a restarted plane knows its own)."""

    kind: ClassVar[str] = "hello"
    pid: int


@dataclass(frozen=True)
class InFlight:
    """A worker's requests in flight, per model and per replica (those with any)."""

    kind: ClassVar[str] = "in_flight"
    models: Mapping[str, int]
    replicas: Mapping[str, int]
    queued: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """Requests waiting in its flow queues (``gateway.flow.mode: fair``), per model and flow."""
    waited_s: Mapping[str, float] = field(default_factory=dict)
    """How long the latest request it sent on from each model's queue had waited."""


@dataclass(frozen=True)
class Metrics:
    """A worker's gateway metric samples (``workermetrics.py``)."""

    kind: ClassVar[str] = "metrics"
    samples: tuple[Any, ...]


StateChange: TypeAlias = (
    ReplicaReady
    | ReplicaGone
    | ReplicaDraining
    | CatalogReplaced
    | KeysReplaced
    | LimitsReplaced
    | PricesReplaced
    | LimitsShared
    | LimitsCounted
    | KvBlocks
    | StoppedSet
)
"""A change of a gateway's state: one call of its :class:`~llmgw.gateway.feeding.GatewayFeed`."""
ServerEvent: TypeAlias = StateChange | Copy | Live | Serves | SendMetrics | QueuedElsewhere
Request: TypeAlias = (
    Wanted | Used | ReplicaFailed | Usage | UsageSummed | Counted | Hello | InFlight | Metrics
)
Event: TypeAlias = ServerEvent | Request


# -- the codec ----------------------------------------------------------------------------------------


def encode(event: Event) -> bytes:
    """``event`` as one frame."""
    codec = _CODECS.get(getattr(event, "kind", None))  # type: ignore[arg-type]
    if codec is None or not isinstance(event, codec.type):
        raise TypeError(f"{event!r} is no event of the state protocol")
    return json.dumps(
        {"v": VERSION, "kind": event.kind, **codec.write(event)}, separators=(",", ":")
    ).encode()


def decode(frame: bytes) -> Event:
    """The event in ``frame``; :class:`BadFrame` saying what was wrong when it holds none."""
    try:
        data = json.loads(frame)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadFrame(f"a state frame is not JSON ({error}): {_shown(frame)}", _HINT) from None
    if not isinstance(data, dict):
        raise BadFrame(f"a state frame holds no JSON object: {_shown(frame)}", _HINT)
    version = data.get("v", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BadFrame(f"a state frame names no protocol version but {version!r}", _HINT)
    if version > VERSION:
        raise BadFrame(
            f"a state frame of protocol version {version}; this side speaks up to {VERSION}",
            "upgrade this side to the release of the other",
        )
    kind = data.get("kind")
    codec = _CODECS.get(kind) if isinstance(kind, str) else None
    if codec is None:
        raise BadFrame(f"a state frame of unknown kind {kind!r}; known: {', '.join(sorted(_CODECS))}", _HINT)
    try:
        return codec.read(data)
    except KeyError as missing:
        raise BadFrame(f"a {kind!r} frame lacks its field {missing}", _HINT) from None
    except (TypeError, ValueError, AttributeError, ValidationError) as error:
        why = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise BadFrame(f"a {kind!r} frame has a field that is wrong: {why}", _HINT) from None


_HINT = "run one llmgw release on both sides; the frame is skipped, or a follower takes a new full copy"


def _shown(frame: bytes, most: int = 120) -> str:
    return repr(frame[:most]) + ("..." if len(frame) > most else "")


@dataclass(frozen=True)
class _Codec:
    type: type[Any]
    write: Callable[[Any], dict[str, Any]]
    read: Callable[[Mapping[str, Any]], Event]


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} is text, not {value!r}")
    return value


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"{what} is a whole number, not {value!r}")
    return int(value)


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is a JSON object, not {value!r}")
    return value


def _array(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{what} is a list, not {value!r}")
    return value


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise ValueError(f"{what} must be seconds, 0 or more, not {value!r}")
    return float(value)


def _counts(value: object, what: str) -> dict[str, int]:
    return {str(name): _whole(n, f"{what}[{name!r}]") for name, n in _object(value, what).items()}


def _endpoint_fields(endpoint: ReplicaEndpoint) -> dict[str, Any]:
    return {
        "replica_id": endpoint.replica_id,
        "model": endpoint.model,
        "base_url": endpoint.base_url,
        "api_key": endpoint.api_key,
        "capacity": endpoint.capacity,
        "engine": endpoint.engine,
    }


def _read_endpoint(data: Mapping[str, Any]) -> ReplicaEndpoint:
    data = _object(data, "endpoint")
    return ReplicaEndpoint(
        _text(data["replica_id"], "endpoint.replica_id"),
        _text(data["model"], "endpoint.model"),
        _text(data["base_url"], "endpoint.base_url"),
        _text(data["api_key"], "endpoint.api_key"),
        _whole(data.get("capacity", 1), "endpoint.capacity"),
        engine=_text(data["engine"], "endpoint.engine") if "engine" in data else DEFAULT_ENGINE,
    )


def _key_fields(entry: KeyEntry) -> dict[str, Any]:
    return {
        "key_id": entry.key_id,
        "name": entry.name,
        "secret_hash": entry.secret_hash,
        "owner": entry.owner,
        "at": str(entry.place.at),
        "memberships": sorted(str(owner) for owner in entry.place.memberships),
        "collections": list(entry.collections),
    }


def _read_key(data: Mapping[str, Any]) -> KeyEntry:
    data = _object(data, "a key")
    memberships = frozenset(
        Owner.parse(_text(t, "a key's memberships")) for t in _array(data["memberships"], "memberships")
    )
    place = Place(Owner.parse(_text(data["at"], "a key's at")), memberships)
    collections = tuple(_text(c, "a key's collections") for c in data.get("collections", ()))  # absent before
    owner = data.get("owner")
    return KeyEntry(
        _text(data["key_id"], "key_id"),
        _text(data["name"], "a key's name"),
        _text(data["secret_hash"], "secret_hash"),
        None if owner is None else _text(owner, "a key's owner"),
        place,
        collections,
    )


def _kv_fields(update: KvBlocksUpdate) -> dict[str, Any]:
    # ``mismatch`` stays on the node's side: the previous release's readers take no such field
    return {
        "model": update.model,
        "replica_id": update.replica_id,
        "stored": list(update.stored),
        "removed": list(update.removed),
        "reset": update.reset,
        "hash_seed": update.hash_seed,
        "block_size": update.block_size,
    }


def _read_kv(data: Mapping[str, Any]) -> KvBlocksUpdate:
    data = _object(data, "update")
    return KvBlocksUpdate(
        model=_text(data["model"], "update.model"),
        replica_id=_text(data["replica_id"], "update.replica_id"),
        stored=tuple(_whole(h, "update.stored") for h in _array(data.get("stored", []), "update.stored")),
        removed=tuple(_whole(h, "update.removed") for h in _array(data.get("removed", []), "update.removed")),
        reset=bool(data.get("reset", False)),
        hash_seed=_text(data.get("hash_seed", ""), "update.hash_seed"),
        block_size=_whole(data.get("block_size", 0), "update.block_size"),
    )


_USAGE_FIELDS = tuple(f.name for f in dataclasses.fields(UsageRecord))


def _read_usage(data: Mapping[str, Any]) -> Usage:
    record = _object(data["record"], "record")
    unknown = set(record) - set(_USAGE_FIELDS)
    if unknown:
        raise ValueError(f"record has unknown fields {sorted(unknown)}")
    return Usage(UsageRecord(**record))


def _read_counted(data: Mapping[str, Any]) -> Counted:
    # a worker of the previous release (left serving across a restart) names them ``used``
    tokens = data["used"] if "used" in data and "tokens" not in data else data["tokens"]
    return Counted(_counts(tokens, "tokens"), _text(data.get("plane", ""), "plane"))


def _read_limits_counted(data: Mapping[str, Any]) -> LimitsCounted:
    used: dict[str, tuple[int, int]] = {}
    for subject, pair in _object(data["used"], "used").items():
        day, month = _array(pair, f"used[{subject!r}]")
        used[str(subject)] = (_whole(day, "a day's count"), _whole(month, "a month's count"))
    return LimitsCounted(used)


def _read_sums(data: Mapping[str, Any]) -> UsageSummed:
    rows = _array(data["sums"], "sums")
    for row in rows:
        if not isinstance(row, list) or len(row) not in SUM_FIELDS:
            raise ValueError(f"a usage sum has 14 fields (11 or 12 from releases before), not {row!r}")
    return UsageSummed(tuple(tuple(row) for row in rows))


_CODECS: dict[str, _Codec] = {
    codec.type.kind: codec
    for codec in (
        _Codec(
            ReplicaReady,
            lambda e: {"endpoint": _endpoint_fields(e.endpoint), "adapter_paths": dict(e.adapter_paths)},
            lambda d: ReplicaReady(
                _read_endpoint(d["endpoint"]),
                {
                    str(a): _text(p, "adapter_paths")
                    for a, p in _object(d.get("adapter_paths", {}), "adapter_paths").items()
                },
            ),
        ),
        _Codec(
            ReplicaGone,
            lambda e: {"replica_id": e.replica_id},
            lambda d: ReplicaGone(_text(d["replica_id"], "replica_id")),
        ),
        _Codec(
            ReplicaDraining,
            lambda e: {"replica_id": e.replica_id},
            lambda d: ReplicaDraining(_text(d["replica_id"], "replica_id")),
        ),
        _Codec(
            CatalogReplaced,
            lambda e: {"models": [m.model_dump(mode="json") for m in e.models]},
            lambda d: CatalogReplaced(
                tuple(ModelDefinition.model_validate(m) for m in _array(d["models"], "models"))
            ),
        ),
        _Codec(
            KeysReplaced,
            lambda e: {"keys": [_key_fields(k) for k in e.keys]},
            lambda d: KeysReplaced(tuple(_read_key(k) for k in _array(d["keys"], "keys"))),
        ),
        _Codec(
            LimitsReplaced,
            lambda e: {"limits": {s: lim.as_dict() for s, lim in e.limits.items()}},
            lambda d: LimitsReplaced(
                {
                    str(s): Limits.from_dict(dict(_object(v, f"limits[{s!r}]")))
                    for s, v in _object(d["limits"], "limits").items()
                }
            ),
        ),
        _Codec(
            PricesReplaced,
            lambda e: {"prices": e.prices.as_dict()},
            lambda d: PricesReplaced(Prices.from_dict(_object(d["prices"], "prices"))),
        ),
        _Codec(
            LimitsShared,
            lambda e: {"shares": e.shares.as_dict()},
            lambda d: LimitsShared(PlaneShares.from_dict(_object(d["shares"], "shares"))),
        ),
        _Codec(
            LimitsCounted, lambda e: {"used": {s: list(p) for s, p in e.used.items()}}, _read_limits_counted
        ),
        _Codec(
            KvBlocks, lambda e: {"update": _kv_fields(e.update)}, lambda d: KvBlocks(_read_kv(d["update"]))
        ),
        _Codec(StoppedSet, lambda e: {"stopped": e.stopped}, lambda d: StoppedSet(bool(d["stopped"]))),
        _Codec(
            Copy,
            lambda e: {"replica_ids": list(e.replica_ids)},
            lambda d: Copy(tuple(_text(r, "replica_ids") for r in _array(d["replica_ids"], "replica_ids"))),
        ),
        _Codec(Live, lambda e: {}, lambda d: Live()),
        _Codec(Serves, lambda e: {"serves": e.serves}, lambda d: Serves(bool(d["serves"]))),
        _Codec(SendMetrics, lambda e: {}, lambda d: SendMetrics()),
        _Codec(
            QueuedElsewhere,
            lambda e: {"flows": dict(e.flows)},
            lambda d: QueuedElsewhere(_counts(d["flows"], "flows")),
        ),
        _Codec(Wanted, lambda e: {"model": e.model}, lambda d: Wanted(_text(d["model"], "model"))),
        _Codec(Used, lambda e: {"model": e.model}, lambda d: Used(_text(d["model"], "model"))),
        _Codec(
            ReplicaFailed,
            lambda e: {"replica_id": e.replica_id, "reason": e.reason},
            lambda d: ReplicaFailed(_text(d["replica_id"], "replica_id"), _text(d["reason"], "reason")),
        ),
        _Codec(Usage, lambda e: {"record": {n: getattr(e.record, n) for n in _USAGE_FIELDS}}, _read_usage),
        _Codec(UsageSummed, lambda e: {"sums": [list(row) for row in e.sums]}, _read_sums),
        _Codec(Counted, lambda e: {"tokens": dict(e.tokens), "plane": e.plane}, _read_counted),
        _Codec(Hello, lambda e: {"pid": e.pid}, lambda d: Hello(_whole(d["pid"], "pid"))),
        _Codec(
            InFlight,
            lambda e: {
                "models": dict(e.models),
                "replicas": dict(e.replicas),
                "queued": {m: dict(flows) for m, flows in e.queued.items()},
                "waited_s": dict(e.waited_s),
            },
            lambda d: InFlight(
                _counts(d["models"], "models"),
                _counts(d["replicas"], "replicas"),
                {
                    str(m): _counts(flows, f"queued[{m!r}]")
                    for m, flows in _object(d.get("queued", {}), "queued").items()
                },
                {
                    str(m): _seconds(w, f"waited_s[{m!r}]")
                    for m, w in _object(d.get("waited_s", {}), "waited_s").items()
                },
            ),
        ),
        _Codec(
            Metrics,
            lambda e: {"samples": list(e.samples)},
            lambda d: Metrics(tuple(_array(d["samples"], "samples"))),
        ),
    )
}
"""Every kind of event: its class, how it is written, how it is read."""
