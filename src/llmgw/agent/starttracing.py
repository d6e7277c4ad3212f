"""A shard's start on the agent, traced: the control plane's ``replica.start`` span continued.

``StartShard`` carries the ``traceparent`` of the replica's start on the
control plane. The agent's ``shard.start`` span is its child, from the
shard's first STARTING until READY (or FAILED, or stopped), with a child span
per step: the engine build's install and each weights fetch
(:mod:`llmgw.agent.installing`), the engine's launch (the wrapped
:data:`~llmgw.agent.launching.Launcher`) and the wait for its health
(``engine.readiness``, from the launch until READY).

The supervisor calls :meth:`ShardStartTraces.emitted` with every state it
reports; the first STARTING, reported in the shard's own task, also marks
that task as the shard's (a context variable), which is how a launch, made in
the same task, finds its shard. A start begins once per ``traceparent``: an
engine restarted after a crash, or adopted, makes no new trace. Tracing off
(or a spec without ``traceparent``) makes nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from llmgw.agent.launching import EngineProcess, EngineSpawn, Launcher
from llmgw.core.shards import ShardSpec, ShardState
from llmgw.observability.tracing import TRACING_OFF, Span, Tracing, context_of, failed

_SHARD: contextvars.ContextVar[str] = contextvars.ContextVar("llmgw_traced_shard", default="")
"""The replica whose start the current task traces ("" outside a traced shard's task)."""


@dataclass
class _Start:
    span: Span
    readiness: Span | None = None


class ShardStartTraces:
    """The open ``shard.start`` spans of this node, by replica id."""

    def __init__(self, tracing: Tracing = TRACING_OFF) -> None:
        self._tracing = tracing
        self._open: dict[str, _Start] = {}
        self._begun: dict[str, str] = {}
        """The traceparent each replica's last traced start continued (never begun twice)."""

    def emitted(self, spec: ShardSpec, state: ShardState, error: str = "") -> None:
        """The supervisor reported ``state`` for ``spec``'s shard: begin or end its start's span."""
        if not self._tracing.enabled:
            return
        replica_id = spec.replica_id
        if state is ShardState.STARTING:
            if spec.traceparent and self._begun.get(replica_id) != spec.traceparent:
                self._begin(spec)
        elif state is ShardState.READY:
            self._end(replica_id, "")
        elif state.ended:
            self._end(replica_id, error or state.name.lower())
            if state is ShardState.STOPPED:
                self._begun.pop(replica_id, None)

    def _begin(self, spec: ShardSpec) -> None:
        self._end(spec.replica_id, "started again")
        self._begun[spec.replica_id] = spec.traceparent
        span = self._tracing.span(
            "shard.start",
            context_of(spec.traceparent),
            {"llmgw.replica": spec.replica_id, "llmgw.model": spec.model, "llmgw.engine": spec.engine},
        )
        self._open[spec.replica_id] = _Start(span)
        _SHARD.set(spec.replica_id)

    def _end(self, replica_id: str, failure: str) -> None:
        start = self._open.pop(replica_id, None)
        if start is None:
            return
        for span in (start.readiness, start.span):
            if span is not None:
                if failure:
                    failed(span, failure)
                span.end()

    @contextlib.contextmanager
    def step(self, replica_id: str, name: str, **attributes: str | int | bool) -> Iterator[Span | None]:
        """A child span of the replica's open start around a step (None, and nothing made, without one)."""
        start = self._open.get(replica_id)
        if start is None:
            yield None
            return
        span = self._tracing.span(name, start.span, {f"llmgw.{k}": v for k, v in attributes.items()})
        try:
            yield span
        except BaseException as error:
            failed(span, str(error) or type(error).__name__)
            raise
        finally:
            span.end()

    def launcher(self, launch: Launcher) -> Launcher:
        """``launch``, each engine started by a traced shard's task a span, its readiness another."""
        if not self._tracing.enabled:
            return launch

        async def traced(spawn: EngineSpawn) -> EngineProcess:
            replica_id = _SHARD.get()
            start = self._open.get(replica_id)
            if start is None:
                return await launch(spawn)
            if start.readiness is not None:  # the engine before this one ended without being ready
                failed(start.readiness, "engine ended before it was ready")
                start.readiness.end()
                start.readiness = None
            with self.step(replica_id, "engine.launch", program=spawn.command[0]) as span:
                process = await launch(spawn)
                if span is not None:
                    span.set_attribute("llmgw.pid", process.pid)
            start.readiness = self._tracing.span("engine.readiness", start.span, {"llmgw.pid": process.pid})
            return process

        return traced
