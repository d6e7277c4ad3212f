"""The agent's KV-events relay: follow each vLLM shard's KV events, send net changes up the stream.

For every shard started with a KV-events port (``kv_events`` in its profile),
:class:`KvReporter` follows the engine's ZMQ socket
(:class:`llmgw.agent.kv_events.KvEventsFollower`, listening on the KV-events
port, asking the engine's replay port for what a gap lost) and sends each net
change as a :class:`~llmgw.core.kvblocks.KvBlocksUpdate`. A shard that restarts (a new port) or goes is reset;
on every new stream (:meth:`KvReporter.resend`, from the session's ``on_stream``) each shard's whole mirror is
sent again as a reset followed by its blocks, so the control plane never
keeps a stale view. A follower that fails ends :meth:`KvReporter.run` with its
error (the process supervisor logs it and runs the reporter again, which
follows every shard anew, each from a reset): no shard is left unfollowed
silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from llmgw.agent.kv_events import BlockChanges, BlockMirror, HashCheck, KvEventsFollower
from llmgw.core.agentstream import AgentMessage
from llmgw.core.kvblocks import KvBlocksUpdate
from llmgw.core.shards import ShardSpec
from llmgw.engines.vllm import HASH_SEED
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

MAX_PER_MESSAGE = 50_000
"""Block hashes per update (a full copy goes in several)."""


Ports = tuple[int, int | None]
"""A followed shard's KV-events port and replay port."""


class Follower(Protocol):
    """One shard's KV-events follower (:class:`~llmgw.agent.kv_events.KvEventsFollower`)."""

    @property
    def mirror(self) -> BlockMirror: ...
    @property
    def check(self) -> HashCheck: ...
    async def run(self) -> None: ...


class FollowerFactory(Protocol):
    def __call__(
        self,
        endpoint: str,
        on_changes: Callable[[BlockChanges], None],
        *,
        topic: str,
        replay_endpoint: str | None,
    ) -> Follower: ...


class FollowedShard(Protocol):
    spec: ShardSpec
    kv_events_port: int | None
    kv_replay_port: int | None


class KvReporter:
    """Follows the KV events of the shards in ``shards`` and reports their blocks through ``send``."""

    def __init__(
        self,
        shards: Mapping[str, FollowedShard],
        send: Callable[[AgentMessage], None],
        host: str = "127.0.0.1",
        follow: FollowerFactory = KvEventsFollower,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.shards = shards
        self.send = send
        self.host = host
        self._follow = follow
        self._clock = clock
        self._followed: dict[str, tuple[Ports, Follower, asyncio.Task[None]]] = {}
        self._models: dict[str, str] = {}

    @property
    def followers(self) -> dict[str, Follower]:
        """The followed shards' followers, by replica (their gap counters among them)."""
        return {replica_id: followed[1] for replica_id, followed in self._followed.items()}

    def _message(self, replica_id: str, changes: BlockChanges) -> None:
        stored = sorted(changes.stored)
        removed = sorted(changes.removed)
        first = True
        while first or stored or removed:
            part = KvBlocksUpdate(model=self._models.get(replica_id, ""), replica_id=replica_id,
                                  reset=changes.reset and first, stored=tuple(stored[:MAX_PER_MESSAGE]),
                                  removed=tuple(removed[:MAX_PER_MESSAGE]), hash_seed=HASH_SEED,
                                  block_size=changes.block_size, mismatch=changes.mismatch)  # fmt: skip
            stored, removed = stored[MAX_PER_MESSAGE:], removed[MAX_PER_MESSAGE:]
            self.send(part)
            first = False

    def sync(self) -> None:
        """Follow new shards and new ports; stop following shards that went (their blocks reset).

        A follower that failed raises its error here, its replica named in a note.
        """
        for replica_id, (_, _, task) in self._followed.items():
            if task.done() and not task.cancelled() and task.exception() is not None:
                error = task.exception()
                assert error is not None
                error.add_note(f"while following the KV events of replica {replica_id}")
                raise error
        wanted = {rid: s for rid, s in self.shards.items() if s.kv_events_port}
        for replica_id, (followed_ports, _, task) in list(self._followed.items()):
            shard = wanted.get(replica_id)
            if shard is None or (shard.kv_events_port, shard.kv_replay_port) != followed_ports:
                task.cancel()
                del self._followed[replica_id]
                self._message(replica_id, BlockChanges(reset=True))
                self._models.pop(replica_id, None)
        for replica_id, shard in wanted.items():
            if replica_id in self._followed:
                continue
            port, replay_port = shard.kv_events_port or 0, shard.kv_replay_port
            self._models[replica_id] = shard.spec.model

            def report(changes: BlockChanges, replica_id: str = replica_id) -> None:
                self._message(replica_id, changes)

            replay = f"tcp://{self.host}:{replay_port}" if replay_port else None
            follower = self._follow(f"tcp://{self.host}:{port}", report, topic="", replay_endpoint=replay)
            task = asyncio.get_running_loop().create_task(follower.run(), name=f"kv-events-{replica_id}")
            self._followed[replica_id] = ((port, replay_port), follower, task)
            self._message(replica_id, BlockChanges(reset=True))

    def resend(self) -> None:
        """A new stream: every followed shard's whole mirror, as a reset and its blocks (with the
        block size its engine reported and whether its hashes agree with llmgw's)."""
        for replica_id, (_, follower, _) in self._followed.items():
            copy = follower.mirror.full_copy()
            copy.mismatch = follower.check.mismatch
            self._message(replica_id, copy)

    async def run(self, period_s: float = 1.0) -> None:
        """Keep following the shards (checked every ``period_s``) until cancelled or a follower fails."""
        try:
            while True:
                self.sync()
                await self._clock.sleep(period_s)
        finally:
            followed, self._followed = self._followed, {}  # a run again follows every shard anew
            for _, _, task in followed.values():
                task.cancel()
