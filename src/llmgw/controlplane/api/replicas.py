"""``/api/replicas``: every replica as the leader sees it, and each one's engine output."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from llmgw.adminapi.schemas import ReplicaLogs, ReplicaView
from llmgw.controlplane.api.errors import declared
from llmgw.controlplane.api.state import CLUSTER_ROLE, State
from llmgw.errors import NoCapacity, NotFound

router = APIRouter(
    prefix="/api", tags=["replicas"], dependencies=CLUSTER_ROLE, responses=declared(401, 503, 403)
)

MAX_LINES = 100_000


@router.get("/replicas", response_model=list[ReplicaView])
async def replicas(state: State) -> list[ReplicaView]:
    """Each replica: model, node, state, where it computes, port, restarts, last error, adapters."""
    return [
        ReplicaView(
            id=r.replica_id,
            model=r.model,
            node=r.node_id,
            state=r.state,
            port=r.port,
            on=r.compute,
            restarts=r.restarts,
            error=r.error,
            adapters=dict(r.adapter_paths),
            profile=r.profile + 1,
            draining=r.drain_reason if r.draining_since is not None else "",
            progress=r.fetching.describe() if r.fetching else "",
            fetched_bytes=r.fetching.done if r.fetching else 0,
            fetch_total_bytes=r.fetching.total if r.fetching else 0,
            fetch_bytes_per_s=r.fetching.bytes_per_s if r.fetching else 0.0,
            kv_block_size=r.kv_block_size,
            kv_mismatch=r.kv_mismatch,
        )
        for r in sorted(state.fleet.replicas.values(), key=lambda r: (r.model, r.replica_id))
    ]


@router.get(
    "/replicas/{replica_id}/logs",
    response_model=ReplicaLogs,
    responses={
        **declared(404),
        200: {
            "description": "The last lines as JSON; with follow=true, plain text lines as they come.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
    },
)
async def replica_logs(
    replica_id: str, state: State, lines: int = 200, follow: bool = False
) -> ReplicaLogs | StreamingResponse:
    """The replica's engine output: its last lines, then (follow) each new one as plain text."""
    lines = max(0, min(lines, MAX_LINES))
    replica = state.fleet.replicas.get(replica_id)
    if replica is None:
        raise NotFound(f"no replica {replica_id}", "list them with 'llmgw ctl replicas'")
    node_id = replica.node_id
    node = state.fleet.nodes.get(node_id)
    if node is None:
        raise NoCapacity(
            f"node {node_id}, which runs {replica_id}, is not connected",
            "its log is on the node, in the shard's directory under the agent's work directory",
        )
    channel = node.channel

    def attached() -> bool:
        now = state.fleet.nodes.get(node_id)
        return now is not None and now.channel is channel

    batches = state.fleet.logs.read(channel, replica_id, lines, follow, attached)
    if not follow:
        found = [line async for batch in batches for line in batch]
        return ReplicaLogs(replica=replica_id, node=node_id, lines=found)
    first = await anext(batches)
    return StreamingResponse(_lines_of(first, batches), media_type="text/plain; charset=utf-8")


async def _lines_of(first: list[str], rest: AsyncIterator[list[str]]) -> AsyncIterator[str]:
    if first:
        yield "\n".join(first) + "\n"
    async for batch in rest:
        if batch:
            yield "\n".join(batch) + "\n"
