"""``llmgw restart``: every process of the cluster starts again, one at a time, no request failing.

The leader runs it (``POST /api/cluster/restart``; a standby relays it), in order:

1. every connected agent, over its stream (RestartAgent): its engines keep
   serving and the next agent adopts them; the next step waits until the node
   registered again (a new session in the fleet);
2. every other control plane, standbys all (``POST /api/control-plane/restart``
   on its own address, with the caller's own credentials; that route is never
   relayed): the next step waits until its ``/healthz`` answers with a new
   instance and it announced itself in the store again;
3. this control plane, last: the route answers, then the process stops cleanly
   (leadership handed off, requests finished) and starts again
   (:mod:`llmgw.controlplane.lifecycle.selfrestart`).

Control planes that were not seen for three leases are left out (they are
down already). A process that does not come back within ``wait_s`` ends the
restart there, with an error naming it; what was restarted stays restarted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from llmgw.controlplane.nodes.fleet import Fleet
from llmgw.core.nodes import RestartAgent
from llmgw.errors import ChannelClosed, LlmgwError
from llmgw.store.leases import ControlPlaneRecord

log = logging.getLogger(__name__)

WAIT_S = 120.0
"""How long each process has to come back."""

POLL_S = 0.25


class RestartTimedOut(LlmgwError):
    status = 503


@dataclass(frozen=True)
class Restarted:
    """One process restarted: ``agent`` (by node) or ``control-plane`` (by name), and how long it took."""

    kind: str
    name: str
    seconds: float


class Peers(Protocol):
    """How the leader reaches another control plane's HTTP address."""

    async def instance(self, http_address: str) -> str: ...
    async def restart(self, http_address: str, authorization: str, reason: str) -> None: ...


class HttpPeers:
    """:class:`Peers` over plain HTTP (``/healthz``, ``/api/control-plane/restart``)."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self._timeout_s = timeout_s

    async def instance(self, http_address: str) -> str:
        def get() -> str:
            with urllib.request.urlopen(f"{http_address}/healthz", timeout=self._timeout_s) as answer:
                return str(json.load(answer).get("instance", ""))

        try:
            return await asyncio.to_thread(get)
        except (OSError, ValueError):
            return ""  # not answering (yet)

    async def restart(self, http_address: str, authorization: str, reason: str) -> None:
        def post() -> None:
            request = urllib.request.Request(
                f"{http_address}/api/control-plane/restart",
                data=json.dumps({"reason": reason}).encode(),
                headers={"Authorization": authorization, "Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=self._timeout_s) as answer:
                answer.read()

        try:
            await asyncio.to_thread(post)
        except urllib.error.HTTPError as error:
            raise LlmgwError(
                f"the control plane at {http_address} refused to restart: HTTP {error.code} "
                f"{error.read().decode(errors='replace')[:200]}",
                "check that it runs this llmgw version and that the token is the cluster's admin token",
            ) from None
        except OSError as error:
            raise LlmgwError(
                f"the control plane at {http_address} cannot be reached to restart it: {error}",
                "check that its http address (from its server.yaml) is reachable from the leader",
            ) from None


class ClusterRestart:
    """Restart the agents, then the other control planes, each waited for; the caller restarts this one."""

    def __init__(
        self,
        fleet: Fleet,
        me: str,
        planes: Callable[[], Awaitable[list[ControlPlaneRecord]]],
        peers: Peers,
        *,
        lease_s: float,
        wait_s: float = WAIT_S,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self._me = me
        self._planes = planes
        self._peers = peers
        self._lease_s = lease_s
        self._wait_s = wait_s
        self._poll_s = poll_s
        self._clock = clock

    async def run(self, reason: str, authorization: str) -> list[Restarted]:
        done: list[Restarted] = []
        for node_id in sorted(self._fleet.nodes):
            restarted = await self._agent(node_id, reason)
            if restarted is not None:
                done.append(restarted)
        for plane in await self._planes():
            if plane.name == self._me:
                continue
            if plane.seen_ago_s > 3 * self._lease_s:
                log.info("control plane %s was not seen for %.0f s: left out", plane.name, plane.seen_ago_s)
                continue
            done.append(await self._control_plane(plane, reason, authorization))
        return done

    async def _agent(self, node_id: str, reason: str) -> Restarted | None:
        session = self._fleet.nodes.get(node_id)
        if session is None:
            return None
        started = self._clock()
        try:
            await session.channel.send(RestartAgent(reason=reason))
        except ChannelClosed as error:
            log.warning("could not ask node %s to restart: %s", node_id, error)
            return None
        log.info("restarting the agent of node %s", node_id)
        await self._until(
            lambda: _new_session(self._fleet, node_id, session),
            f"the agent of node {node_id} did not register again",
            "see the agent's log on that node; 'llmgw ctl nodes' shows whether it is connected",
        )
        return Restarted("agent", node_id, self._clock() - started)

    async def _control_plane(self, plane: ControlPlaneRecord, reason: str, authorization: str) -> Restarted:
        before = await self._peers.instance(plane.http_address)
        started = self._clock()
        log.info("restarting control plane %s at %s", plane.name, plane.http_address)
        await self._peers.restart(plane.http_address, authorization, reason)

        async def back() -> bool:
            instance = await self._peers.instance(plane.http_address)
            if not instance or instance == before:
                return False
            seen = next((p for p in await self._planes() if p.name == plane.name), None)
            return seen is not None and seen.seen_ago_s < self._clock() - started

        await self._until(
            back,
            f"control plane {plane.name} did not come back at {plane.http_address}",
            "see its log; 'llmgw ctl status' lists the control planes the store has seen",
        )
        return Restarted("control-plane", plane.name, self._clock() - started)

    async def _until(self, condition: Callable[[], object], what: str, hint: str) -> None:
        deadline = self._clock() + self._wait_s
        while True:
            outcome = condition()
            if asyncio.iscoroutine(outcome):
                outcome = await outcome
            if outcome:
                return
            if self._clock() >= deadline:
                raise RestartTimedOut(f"{what} within {self._wait_s:g} s; the restart stopped there", hint)
            await asyncio.sleep(self._poll_s)


def _new_session(fleet: Fleet, node_id: str, old: object) -> bool:
    current = fleet.nodes.get(node_id)
    return current is not None and current is not old
