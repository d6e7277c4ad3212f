"""Keeping llmgw's table in step with the cluster: a supervised component of each process (C10.2).

Every ``interval_s`` the component asks its process what it needs (its
:class:`~llmgw.operations.firewall.FirewallPart`: ``firewall.enabled``, its
ports, its peers as they are now) and, when that changed, writes the part and
applies the machine's table. A machine without ``nft`` gets one warning and
the component carries on (the part stays written for ``llmgw firewall sync``);
a refusal by nft (not root, say) is logged once until it changes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable

from llmgw.operations.firewall import FirewallPart, agent_part
from llmgw.operations.nftables import FirewallError, FirewallState, Nft, sync
from llmgw.runtime.clock import Clock, SystemClock

log = logging.getLogger(__name__)

INTERVAL_S = 10.0
"""How often the part is computed again: a new peer is let in within this."""

PartSource = Callable[[], Awaitable[FirewallPart]]


class FirewallKeeper:
    """Applies this process's part whenever it changes."""

    def __init__(
        self,
        source: PartSource,
        state: FirewallState,
        nft: Nft,
        clock: Clock | None = None,
        interval_s: float = INTERVAL_S,
    ) -> None:
        self._source = source
        self._state = state
        self._nft = nft
        self._clock = clock or SystemClock()
        self._interval_s = interval_s
        self.applied: FirewallPart | None = None
        """The part last applied (or written, where nft is absent)."""
        self._warned = ""

    async def run(self) -> None:
        while True:
            await self.once()
            await self._clock.sleep(self._interval_s)

    async def once(self) -> None:
        """Compute the part; write and apply it when it changed."""
        part = await self._source()
        if part == self.applied:
            return
        if self.applied is None and not part.rules and not self._state.has(part.name):
            self.applied = part  # nothing to guard (loopback only, or disabled) and nothing written before
            log.info("firewall %s: no port of this process needs a rule", part.name)
            return
        try:
            self._state.write(part)
        except OSError as error:
            self._warn_once(
                f"llmgw's firewall was not applied: cannot write {self._state.directory}: {error}"
            )
            return
        if not self._nft.available():
            self._warn_once(
                "nft is not installed: llmgw's firewall is not applied on this machine "
                "(install nftables, or set firewall.enabled to false to silence this)"
            )
            self.applied = part
            return
        try:
            result = await asyncio.to_thread(sync, self._state, self._nft)
        except FirewallError as error:
            self._warn_once(f"llmgw's firewall was not applied: {error.message} ({error.hint})")
            return  # tried again next time
        self.applied = part
        self._warned = ""
        rules = sum(len(p.rules) for p in result.parts if p.enabled)
        log.info(
            "firewall %s: table inet llmgw %s (%d rules from %d parts)",
            part.name,
            "applied" if result.table else "removed",
            rules,
            len(result.parts),
        )

    def _warn_once(self, message: str) -> None:
        if message != self._warned:
            log.warning("%s", message)
            self._warned = message


Resolver = Callable[[str], Awaitable[list[str]]]


async def resolve(host: str) -> list[str]:
    """The addresses of ``host`` (itself when it is one); empty when it does not resolve."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        log.warning("firewall: %s does not resolve; it is not let in until it does", host)
        return []
    return sorted({str(info[4][0]) for info in infos})


def host_of(address: str) -> str:
    """The host of ``host:port``, ``[v6]:port``, a URL, or a bare host."""
    text = address.split("://", 1)[-1].split("/", 1)[0]
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    if text.count(":") == 1:
        return text.split(":", 1)[0]
    return text


async def addresses(hosts: Iterable[str], resolver: Resolver = resolve) -> list[str]:
    """Every address of these hosts (each given as an address, host:port or URL)."""
    out: list[str] = []
    for host in {host_of(h) for h in hosts if h}:
        if host:
            out.extend(await resolver(host))
    return out


def agent_source(
    node_id: str,
    enabled: bool,
    address: str,
    ports: tuple[int, int],
    control_planes: Callable[[], list[str]],
    resolver: Resolver = resolve,
) -> PartSource:
    """A node's part, read now: its engines' ports, from the control planes it knows (learned ones too)."""

    async def part() -> FirewallPart:
        return agent_part(
            node_id,
            enabled=enabled,
            address=address,
            ports=ports,
            control_planes=await addresses(control_planes(), resolver),
        )

    return part
