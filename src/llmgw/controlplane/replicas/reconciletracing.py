"""The reconciler's spans: a pass that does something is a trace; a replica's start is a span.

:class:`PassTrace` makes a pass's root span only at the pass's first action
(placing, scaling, starting, restarting, stopping), with the pass's start as
its start time, so a pass that changes nothing leaves no trace. Each action
is a child span with its attributes; a placement carries every node's reason
to turn the replica down.

:class:`ReplicaStarts` keeps each replica's ``replica.start`` span open from
its placement (or restart) until its node reports it READY (or it fails or
goes); the span's ``traceparent`` goes down to the agent on ``StartShard``,
whose spans of the start (weights, launch, readiness) continue the trace.

Tracing off, the reconciler holds :data:`NO_PASS` and a ``ReplicaStarts``
that makes nothing: no span object is made.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from llmgw.core.placement import Decision
from llmgw.observability.tracing import TRACING_OFF, Span, Tracing, failed, traceparent


class PassTrace:
    """One reconcile pass's spans; the root is made at the first action."""

    def __init__(self, tracing: Tracing = TRACING_OFF) -> None:
        self._tracing = tracing
        self._started_ns = time.time_ns()
        self._root: Span | None = None

    @property
    def root(self) -> Span | None:
        """The pass's span once something happened (None before, and always with tracing off)."""
        return self._root

    def _parent(self) -> Span:
        if self._root is None:
            self._root = self._tracing.span("reconcile", start_time=self._started_ns)
        return self._root

    def action(
        self, name: str, attributes: Mapping[str, str | int | bool | Sequence[str]], failure: str = ""
    ) -> None:
        """A child span of the pass, ended at once; failed with ``failure`` when one is given."""
        if not self._tracing.enabled:
            return
        span = self._tracing.span(name, self._parent(), dict(attributes))
        if failure:
            failed(span, failure)
        span.end()

    def placed(self, model: str, decision: Decision) -> None:
        """The placement of one replica of ``model``: where, and why not elsewhere."""
        self.action(
            "placement",
            {
                "llmgw.model": model,
                "llmgw.node": decision.node_id,
                "llmgw.devices": [str(d) for d in decision.devices],
                "llmgw.refusals": [f"{node}: {why}" for node, why in decision.refusals.items()],
            },
            "" if decision.placed else "no node can take a replica",
        )

    def end(self) -> None:
        """End the pass's span, if there is one."""
        if self._root is not None:
            self._root.end()


NO_PASS = PassTrace()
"""The pass trace while tracing is off: it makes nothing."""


class ReplicaStarts:
    """The open ``replica.start`` spans, by replica id."""

    def __init__(self, tracing: Tracing = TRACING_OFF) -> None:
        self._tracing = tracing
        self._open: dict[str, Span] = {}

    def begin(self, pass_trace: PassTrace, replica_id: str, model: str, node_id: str, why: str) -> str:
        """Open the replica's start span under the pass; its ``traceparent`` ("" with tracing off)."""
        if not self._tracing.enabled:
            return ""
        self.end(replica_id, "started again")
        pass_trace.action("replica." + why, {"llmgw.replica": replica_id, "llmgw.model": model})
        span = self._tracing.span(
            "replica.start",
            pass_trace.root,
            {"llmgw.replica": replica_id, "llmgw.model": model, "llmgw.node": node_id, "llmgw.why": why},
        )
        self._open[replica_id] = span
        return traceparent(span)

    def end(self, replica_id: str, failure: str = "") -> None:
        """Close the replica's start span: it serves (no ``failure``), or it never will."""
        span = self._open.pop(replica_id, None)
        if span is None:
            return
        if failure:
            failed(span, failure)
        span.end()

    def __contains__(self, replica_id: str) -> bool:
        return replica_id in self._open
