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
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.upgrades import ReleaseFile, UpgradeAgent, UpgradeResult
from llmgw.errors import ChannelClosed, Conflict, NotFound, UntrustedRelease
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.releases import FETCH_HINT, SIGNATURE, SUMS, WHEEL, parse_sums, read_trusted_key
from llmgw.pki.signing import verify
from llmgw.runtime.waiting import wait_event

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


class AgentUpgrades:
    """Checks a release against the mirror and the trusted key, and rolls it over the nodes."""

    def __init__(
        self,
        fleet: Fleet,
        blobs: BlobStore,
        trusted_pub: Path,
        node_timeout_s: float = NODE_TIMEOUT_S,
        poll_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self._blobs = blobs
        self._trusted_pub = trusted_pub
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

    def start(self, release: UpgradeAgent, nodes: list[str] | None = None) -> Rollout:
        """Begin rolling ``release`` over ``nodes`` (every connected node when None); Conflict while
        another rollout runs."""
        if self._task is not None and not self._task.done():
            raise Conflict(
                f"agents are being upgraded to {self.rollout.version if self.rollout else '?'} already",
                hint="wait for it to finish ('llmgw ctl upgrade status'), then start another",
            )
        chosen = sorted(self._fleet.nodes) if nodes is None else list(nodes)
        self.rollout = Rollout(version=release.version, nodes=chosen)
        self._task = asyncio.create_task(self.roll(release, self.rollout), name="agent-upgrades")
        return self.rollout

    async def wait(self) -> Rollout | None:
        """The rollout once it has finished (None when none was started)."""
        if self._task is not None:
            await asyncio.shield(self._task)
        return self.rollout

    def on_result(self, node_id: str, result: UpgradeResult) -> None:
        """A node's answer that it did not upgrade."""
        self._answers[node_id] = result
        self._heard.set()

    async def roll(self, release: UpgradeAgent, rollout: Rollout) -> None:
        try:
            for node_id in rollout.nodes:
                rollout.current = node_id
                error = await self._upgrade(node_id, release)
                if error:
                    rollout.error = error
                    log.error("agent upgrade to %s stopped at node %s: %s", release.version, node_id, error)
                    return
                rollout.upgraded.append(node_id)
                log.info("node %s runs llmgw %s", node_id, release.version)
        finally:
            rollout.current = ""
            rollout.finished = True

    async def _upgrade(self, node_id: str, release: UpgradeAgent) -> str:
        """Upgrade one node; why it did not ("" when it did)."""
        node = self._fleet.nodes.get(node_id)
        if node is None:
            return f"node {node_id} is not connected; start its agent, then upgrade again"
        if node.agent_version == release.version:
            return ""
        self._answers.pop(node_id, None)
        self._fleet.release_blobs[node_id] = frozenset(f.sha256 for f in release.files)
        try:
            await node.channel.send(release)
        except ChannelClosed as error:
            self._fleet.release_blobs.pop(node_id, None)
            return f"could not send the release to node {node_id}: {error}"
        deadline = self._clock() + self._node_timeout_s
        try:
            while True:
                now = self._fleet.nodes.get(node_id)
                if now is not None and now.agent_version == release.version:
                    return ""
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
