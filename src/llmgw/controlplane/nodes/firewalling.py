"""The control plane's firewall part, read from the store: settings, nodes and control planes (C10.2).

The part is computed again every few seconds by the ``firewall`` component
(:class:`~llmgw.operations.firewallkeeping.FirewallKeeper`), so a node that
registers, a control plane that announces itself or a changed
``firewall.enabled`` / ``firewall.networks`` reaches the table within that.
"""

from __future__ import annotations

from llmgw.core.settingtypes import FIREWALL_ENABLED, FIREWALL_NETWORKS
from llmgw.operations.firewall import FirewallPart, server_part
from llmgw.operations.firewallkeeping import PartSource, Resolver, addresses, resolve
from llmgw.store.database import Store
from llmgw.store.leases import Leases


def server_source(
    store: Store,
    name: str,
    http: tuple[str, int],
    agent_server: tuple[str, int],
    resolver: Resolver = resolve,
) -> PartSource:
    """A control plane's part, read now: the settings, every node and every control plane the store knows."""

    async def part() -> FirewallPart:
        enabled = await store.settings.get(FIREWALL_ENABLED, True)
        networks = await store.settings.get(FIREWALL_NETWORKS, [])
        nodes = [node.address for node in await store.nodes.list()]
        planes = [
            a for cp in await Leases(store).control_planes() for a in (cp.agent_address, cp.http_address)
        ]
        return server_part(
            name,
            enabled=enabled is not False,
            networks=[n for n in networks if isinstance(n, str)] if isinstance(networks, list) else [],
            http=http,
            agent_server=agent_server,
            peers=await addresses(nodes + planes, resolver),
        )

    return part
