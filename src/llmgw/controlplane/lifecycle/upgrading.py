"""Rolling agents onto a signed release, one node at a time (``llmgw ctl upgrade agents``).

The release's files are in the mirror (the command uploads them); the leader
checks its SHA256SUMS against its own trusted key and finds every file in the
mirror before anything is sent. Then, node by node: the node may fetch the
release's files, it is sent :class:`~llmgw.core.upgrades.UpgradeAgent`, and
the next node is sent only once this one has registered again with the new
version. A node that answers it did not upgrade, is not connected, or does
not come back within ``node_timeout_s`` stops the rollout, with the reason; the
nodes after it keep their version. Each node verifies the release again
against its own ``trusted.pub``.

Each step is written to the store as it is taken (``store.leader_state``:
the release, the nodes done, the node upgrading and since when), before the
release goes down that node's stream, so a control plane that lost the lease
sends it to no one. A new leader carries the rollout on
(:meth:`AgentUpgrades.take_over`, before it accepts agents): it checks the
release again against its own trusted key and mirror, waits for the node the
last leader was at to register with the new version (sending it the release
again once it is back at the old one; an agent already upgrading ignores it)
within what is left of that node's timeout, then goes on with the next.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.upgrades import ReleaseFile, UpgradeAgent, UpgradeResult
from llmgw.errors import (
    ChannelClosed,
    Conflict,
    LlmgwError,
    NotFound,
    NotLeader,
    StoreError,
    UntrustedRelease,
)
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.releases import FETCH_HINT, SIGNATURE, SUMS, WHEEL, parse_sums, read_trusted_key
from llmgw.pki.signing import verify
from llmgw.runtime.waiting import wait_event
from llmgw.store.database import Store
from llmgw.store.leaderstate import RolloutRecord

log = logging.getLogger(__name__)

NODE_TIMEOUT_S = 600.0
"""How long one node may take to fetch, install, start again and register with the new version."""


@dataclass
class Rollout:
    """Where an upgrade of the agents stands."""

    version: str
    nodes: list[str]
    upgraded: list[str] = field(default_factory=list)
    current: str = ""
    """The node upgrading now ("" between nodes and once finished)."""
    error: str = ""
    finished: bool = False
    started_at: datetime | None = None
    current_since: datetime | None = None
    """When the current node was sent the release (wall time): its timeout counts from then."""


class AgentUpgrades:
    """Checks a release against the mirror and the trusted key, and rolls it over the nodes."""

    def __init__(
        self,
        fleet: Fleet,
        blobs: BlobStore,
        trusted_pub: Path,
        store: Store,
        node_timeout_s: float = NODE_TIMEOUT_S,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self._blobs = blobs
        self._trusted_pub = trusted_pub
        self._store = store
        """Where each step is written (fenced: only the leader's writes are taken)."""
        self._node_timeout_s = node_timeout_s
        self._poll_s = poll_s
        self._clock = clock
        self.rollout: Rollout | None = None
        self._task: asyncio.Task[None] | None = None
        self._answers: dict[str, UpgradeResult] = {}
        self._heard = asyncio.Event()

    def release(self, sums: str, signature: str) -> UpgradeAgent:
        """The release whose SHA256SUMS and signature are given, once signed by the trusted key and
        every file is in the mirror; UntrustedRelease or NotFound saying what is wrong otherwise."""
        try:
            raw = base64.b64decode(signature.strip(), validate=True)
        except (binascii.Error, ValueError) as error:
            raise UntrustedRelease(f"{SIGNATURE} is not base64 on one line", hint=FETCH_HINT) from error
        verify(sums.encode(), raw, read_trusted_key(self._trusted_pub))
        listed = parse_sums(sums.encode())
        wheels = [name for name in listed if WHEEL.match(name)]
        if len(wheels) != 1:
            raise UntrustedRelease(f"{SUMS} lists {len(wheels)} llmgw wheels, not one", hint=FETCH_HINT)
        files = []
        for name, sha256 in sorted(listed.items()):
            if not self._blobs.has(sha256):
                raise NotFound(
                    f"{name} (sha256 {sha256[:12]}…) is not in the mirror",
                    hint="'llmgw ctl upgrade agents --release DIR' uploads the release's files first",
                )
            files.append(ReleaseFile(sha256, name, self._blobs.path_of(sha256).stat().st_size))
        match = WHEEL.match(wheels[0])
        assert match is not None
        return UpgradeAgent(match.group("version"), sums, signature.strip(), tuple(files))

    async def start(self, release: UpgradeAgent, nodes: list[str] | None = None) -> Rollout:
        """Begin rolling ``release`` over ``nodes`` (every connected node when None), once written to
        the store; Conflict while another rollout runs."""
        if self._task is not None and not self._task.done():
            raise Conflict(
                f"agents are being upgraded to {self.rollout.version if self.rollout else '?'} already",
                hint="wait for it to finish ('llmgw ctl upgrade status'), then start another",
            )
        chosen = sorted(self._fleet.nodes) if nodes is None else list(nodes)
        started = self._store.now()
        rollout = Rollout(version=release.version, nodes=chosen, started_at=started)
        await self._store.leader_state.keep_rollout(_record(release, rollout, started))  # unless deposed
        self.rollout = rollout
        self._task = asyncio.create_task(self.roll(release, rollout), name="agent-upgrades")
        return rollout

    async def take_over(self) -> None:
        """Carry on the rollout the store holds from where the last leader was (the rollout this
        process ran when it led before gives way to it): what ``/api/upgrades/agents`` shows."""
        record = await self._store.leader_state.rollout()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
        self.rollout = None if record is None else _rollout(record)
        if record is None or record.finished or self.rollout is None:  # (None exactly when record is)
            return
        rollout = self.rollout
        try:
            release = self.release(record.sums, record.signature)
        except LlmgwError as error:
            rollout.error = f"the upgrade to {record.version} cannot be carried on here: {error}"
            rollout.current, rollout.finished = "", True
            log.error("agent upgrade stopped: %s", rollout.error)
            with contextlib.suppress(StoreError):
                stopped = dataclasses.replace(record, error=rollout.error, current="", finished=True)
                await self._store.leader_state.keep_rollout(stopped)
            return
        log.info(
            "carrying on the agent upgrade to %s: %d of %d nodes done",
            release.version,
            len(rollout.upgraded),
            len(rollout.nodes),
        )
        self._task = asyncio.create_task(self.roll(release, rollout, resumed=True), name="agent-upgrades")

    async def wait(self) -> Rollout | None:
        """The rollout once it has finished (None when none was started)."""
        if self._task is not None:
            await asyncio.shield(self._task)
        return self.rollout

    def on_result(self, node_id: str, result: UpgradeResult) -> None:
        """A node's answer that it did not upgrade."""
        self._answers[node_id] = result
        self._heard.set()

    async def roll(self, release: UpgradeAgent, rollout: Rollout, *, resumed: bool = False) -> None:
        """Upgrade the nodes of ``rollout`` not upgraded yet, in order, each step written first.
        ``resumed``: taken over from another leader, so a node not connected yet is waited for
        (its agent is on its way here) and the node it was at keeps the time it was sent the release."""
        try:
            for node_id in rollout.nodes:
                if node_id in rollout.upgraded:
                    continue
                if node_id != rollout.current or rollout.current_since is None:
                    rollout.current, rollout.current_since = node_id, self._store.now()
                    if not await self._keep(release, rollout):
                        return
                error = await self._upgrade(node_id, release, rollout.current_since, patient=resumed)
                if error:
                    rollout.error = error
                    log.error("agent upgrade to %s stopped at node %s: %s", release.version, node_id, error)
                    rollout.current, rollout.finished = "", True
                    await self._keep(release, rollout)
                    return
                rollout.upgraded.append(node_id)
                rollout.current, rollout.current_since = "", None
                log.info("node %s runs llmgw %s", node_id, release.version)
            rollout.finished = True
            await self._keep(release, rollout)
        finally:
            rollout.current = ""
            rollout.finished = True

    async def _keep(self, release: UpgradeAgent, rollout: Rollout) -> bool:
        """Write where ``rollout`` stands; False when this control plane no longer leads (the rollout
        is the new leader's to carry on). A store out of reach is logged, and the rollout goes on."""
        try:
            record = _record(release, rollout, rollout.started_at or self._store.now())
            await self._store.leader_state.keep_rollout(record)
        except NotLeader as error:
            rollout.error = f"stopped here, the new leader carries the rollout on: {error}"
            log.warning("agent upgrade to %s: %s", release.version, rollout.error)
            return False
        except StoreError as error:
            log.warning("agent upgrade to %s: could not record its progress: %s", release.version, error)
        return True

    async def _upgrade(self, node_id: str, release: UpgradeAgent, since: datetime, *, patient: bool) -> str:
        """Upgrade one node, sent the release at ``since`` (wall time); why it did not ("" when it
        did). ``patient``: a node not connected is waited for within its timeout."""
        node = self._fleet.nodes.get(node_id)
        if node is None and not patient:
            return f"node {node_id} is not connected; start its agent, then upgrade again"
        if node is not None and node.agent_version == release.version:
            return ""
        self._answers.pop(node_id, None)
        self._fleet.release_blobs[node_id] = frozenset(f.sha256 for f in release.files)
        elapsed_s = max(0.0, (self._store.now() - since).total_seconds())
        deadline = self._clock() + self._node_timeout_s - elapsed_s
        sent = False
        try:
            while True:
                now = self._fleet.nodes.get(node_id)
                if now is not None and now.agent_version == release.version:
                    return ""
                if now is not None and not sent:
                    try:
                        await now.channel.send(release)
                        sent = True
                    except ChannelClosed as error:
                        if not patient:
                            return f"could not send the release to node {node_id}: {error}"
                answer = self._answers.pop(node_id, None)
                if answer is not None and answer.version == release.version:
                    return f"node {node_id} did not upgrade: {answer.error}"
                if self._clock() >= deadline:
                    return (
                        f"node {node_id} did not register with llmgw {release.version} within "
                        f"{self._node_timeout_s:.0f} s; read its agent's log"
                    )
                self._heard.clear()
                await wait_event(self._heard, self._poll_s)
        finally:
            self._fleet.release_blobs.pop(node_id, None)


def _record(release: UpgradeAgent, rollout: Rollout, started_at: datetime) -> RolloutRecord:
    return RolloutRecord(
        version=rollout.version,
        sums=release.sums,
        signature=release.signature,
        nodes=tuple(rollout.nodes),
        started_at=started_at,
        upgraded=tuple(rollout.upgraded),
        current=rollout.current,
        current_since=rollout.current_since,
        error=rollout.error,
        finished=rollout.finished,
    )


def _rollout(record: RolloutRecord) -> Rollout:
    return Rollout(
        version=record.version,
        nodes=list(record.nodes),
        upgraded=list(record.upgraded),
        current=record.current,
        error=record.error,
        finished=record.finished,
        started_at=record.started_at,
        current_since=record.current_since,
    )
