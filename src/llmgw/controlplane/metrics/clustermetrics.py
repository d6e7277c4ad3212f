"""The cluster's state as Prometheus metrics: nodes, replicas, leadership, reconcile passes, the store.

Nodes, replicas and leadership are read from the parts that hold them when
``/metrics`` is scraped (:class:`ClusterCollector`): nothing is kept up to
date between scrapes. Reconcile passes are observed as the reconciler ends
each one (``Reconciler(on_pass=...)``), and store statements through
SQLAlchemy's engine events (:func:`watch_store`). docs/metrics.md lists every
name.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from llmgw.controlplane.nodes.fleet import Fleet

RECONCILE_DURATION = Histogram(
    "llmgw_reconcile_duration_seconds",
    "One reconcile pass, from reading the desired state to the last command sent.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STORE_DURATION = Histogram(
    "llmgw_store_query_duration_seconds",
    "One statement sent to the store, until its result.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
STORE_ERRORS = Counter(
    "llmgw_store_errors", "Statements the store failed (connection lost, timeout, conflict)."
)

_STARTED = "llmgw_statement_started"
"""Key in a connection's ``info``: when its statements started (a stack: a statement at a time)."""


def observe_pass(seconds: float) -> None:
    """The reconciler's ``on_pass``: one pass took ``seconds``."""
    RECONCILE_DURATION.observe(seconds)


def watch_store(engine: AsyncEngine) -> None:
    """Time every statement ``engine`` sends, and count those that fail."""
    sync = engine.sync_engine

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        conn.info.setdefault(_STARTED, []).append(time.perf_counter())

    def after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        started = conn.info.get(_STARTED)
        if started:
            STORE_DURATION.observe(time.perf_counter() - started.pop())

    def failed(context: Any) -> None:
        STORE_ERRORS.inc()
        connection = context.connection
        started = connection.info.get(_STARTED) if connection is not None else None
        if started:
            started.pop()

    event.listen(sync, "before_cursor_execute", before)
    event.listen(sync, "after_cursor_execute", after)
    event.listen(sync, "handle_error", failed)


class Leading(Protocol):
    """What the collector reads of leadership."""

    @property
    def leading(self) -> bool: ...

    epoch: int | None


_GAUGES = (
    ("llmgw_nodes_connected", "Nodes whose agent holds a session with this control plane.", ()),
    ("llmgw_replicas", "Replicas by model and state.", ("model", "state")),
    ("llmgw_leader", "1 while this control plane leads, else 0.", ()),
    ("llmgw_lease_epoch", "The leader lease's epoch this control plane holds; 0 when it holds none.", ()),
)


class ClusterCollector(Collector):
    """Reads the fleet and leadership when scraped."""

    def __init__(self, fleet: Fleet, leadership: Leading) -> None:
        self._fleet = fleet
        self._leadership = leadership

    @staticmethod
    def _families() -> dict[str, GaugeMetricFamily]:
        return {name: GaugeMetricFamily(name, text, labels=labels) for name, text, labels in _GAUGES}

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return list(self._families().values())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = self._families()
        families["llmgw_nodes_connected"].add_metric((), len(self._fleet.nodes))
        states = Tally((r.model, str(r.state)) for r in list(self._fleet.replicas.values()))
        for (model, state), count in sorted(states.items()):
            families["llmgw_replicas"].add_metric((model, state), count)
        leading = self._leadership.leading
        families["llmgw_leader"].add_metric((), 1 if leading else 0)
        families["llmgw_lease_epoch"].add_metric((), (self._leadership.epoch or 0) if leading else 0)
        yield from families.values()


def register_cluster(
    fleet: Fleet, leadership: Leading, registry: CollectorRegistry = REGISTRY
) -> Callable[[], None]:
    """Serve the cluster's state from ``registry`` (the process's ``/metrics``); returns the undo."""
    collector = ClusterCollector(fleet, leadership)
    registry.register(collector)
    return lambda: registry.unregister(collector)
