"""llmgw's own nftables table, ``table inet llmgw``, rendered from what each process needs (C10.2).

Each llmgw process on a machine (a control plane, an agent) states its
:class:`FirewallPart`: its ports and who may reach each of them. The parts of
one machine are rendered together into one table by :func:`render_table`, a
pure function, and applied in one transaction by :func:`ruleset_file`'s text:
the table is created if missing, deleted and created again, so a half-applied
table is never seen and no other table is touched.

The table's one chain hooks ``input`` with policy accept: it guards only
llmgw's ports. Loopback and packets of established connections pass; a port's
allowed sources pass; anything else to that port is refused with a TCP reset
(the caller learns at once, instead of after a timeout). A drop by another
table still drops: nftables runs every base chain of a hook.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

TABLE = "inet llmgw"
ANYWHERE: tuple[str, ...] = ()
"""A rule's sources when everyone may connect."""


@dataclass(frozen=True, slots=True)
class PortRule:
    """One port (or range) and the addresses or networks that may connect to it."""

    first: int
    last: int
    sources: tuple[str, ...]
    """Addresses or CIDR networks; :data:`ANYWHERE` (empty): every source."""
    what: str
    """What listens there, for the rule's comment."""
    anywhere: bool = False
    """True when ``sources`` is empty on purpose (open to all); False: only loopback."""

    def ports(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"

    def to_json(self) -> dict[str, Any]:
        return {
            "first": self.first,
            "last": self.last,
            "sources": list(self.sources),
            "what": self.what,
            "anywhere": self.anywhere,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PortRule:
        return cls(
            int(data["first"]),
            int(data["last"]),
            tuple(str(s) for s in data.get("sources", [])),
            str(data.get("what", "")),
            bool(data.get("anywhere", False)),
        )


@dataclass(frozen=True, slots=True)
class FirewallPart:
    """What one llmgw process on this machine asks of the firewall."""

    name: str
    """The process: ``server-<name>`` or ``agent-<node id>``."""
    enabled: bool
    """``firewall.enabled`` as this process sees it; a disabled part adds no rule."""
    rules: tuple[PortRule, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "enabled": self.enabled, "rules": [r.to_json() for r in self.rules]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FirewallPart:
        return cls(
            str(data["name"]),
            bool(data.get("enabled", True)),
            tuple(PortRule.from_json(r) for r in data.get("rules", [])),
        )


def peer_rule(first: int, last: int, peers: Iterable[str], what: str) -> PortRule:
    """A port only ``peers`` (and loopback) may reach."""
    return PortRule(first, last, normalized(peers), what)


def open_rule(port: int, networks: Sequence[str], what: str) -> PortRule:
    """A port reachable from ``networks``, or from anywhere when there are none."""
    if not networks:
        return PortRule(port, port, ANYWHERE, what, anywhere=True)
    return PortRule(port, port, normalized(networks), what)


def normalized(sources: Iterable[str]) -> tuple[str, ...]:
    """Addresses and networks in canonical form, sorted, without repeats; anything else left out."""
    seen: set[ipaddress.IPv4Network | ipaddress.IPv6Network] = set()
    for source in sources:
        try:
            seen.add(ipaddress.ip_network(source.strip(), strict=False))
        except ValueError:
            continue
    ordered = sorted(seen, key=lambda n: (n.version, n.network_address, n.prefixlen))
    return tuple(str(n.network_address) if n.num_addresses == 1 else str(n) for n in ordered)


def bad_sources(sources: Iterable[str]) -> list[str]:
    """The entries of ``sources`` that are neither an address nor a network."""
    bad = []
    for source in sources:
        try:
            ipaddress.ip_network(source.strip(), strict=False)
        except ValueError:
            bad.append(source)
    return bad


def _split(sources: Sequence[str]) -> tuple[list[str], list[str]]:
    v4 = [s for s in sources if ipaddress.ip_network(s, strict=False).version == 4]
    v6 = [s for s in sources if ipaddress.ip_network(s, strict=False).version == 6]
    return v4, v6


def _quoted(text: str) -> str:
    return '"' + "".join(c for c in text if c.isalnum() or c in " -_.:/,()") + '"'


def _rule_lines(rule: PortRule, part: str) -> tuple[list[str], list[str]]:
    """The rule's accepts and its refusal."""
    ports = rule.ports()
    comment = _quoted(f"{part}: {rule.what}")
    if rule.anywhere:
        return [f"tcp dport {ports} accept comment {comment}"], []
    accepts = []
    v4, v6 = _split(rule.sources)
    if v4:
        accepts.append(f"tcp dport {ports} ip saddr {{ {', '.join(v4)} }} accept comment {comment}")
    if v6:
        accepts.append(f"tcp dport {ports} ip6 saddr {{ {', '.join(v6)} }} accept comment {comment}")
    return accepts, [f"tcp dport {ports} reject with tcp reset comment {comment}"]


def render_table(parts: Iterable[FirewallPart]) -> str:
    """``table inet llmgw`` for these parts; empty when no enabled part has a rule (no table)."""
    enabled = sorted((p for p in parts if p.enabled and p.rules), key=lambda p: p.name)
    if not enabled:
        return ""
    body = [
        "table inet llmgw {",
        "    chain input {",
        "        type filter hook input priority filter; policy accept;",
        '        iifname "lo" accept',
        "        ct state established,related accept",
    ]
    # Every part's accepts come before any part's refusal, so two processes sharing a port range
    # (never the case by design, but cheap to be safe) both get their sources.
    lines = [_rule_lines(rule, part.name) for part in enabled for rule in part.rules]
    accepts = [line for accepting, _ in lines for line in accepting]
    refusals = [line for _, refusing in lines for line in refusing]
    body += [f"        {line}" for line in accepts + refusals]
    body += ["    }", "}"]
    return "\n".join(body) + "\n"


def ruleset_file(parts: Iterable[FirewallPart]) -> str:
    """What ``nft -f`` applies in one transaction: llmgw's table replaced (or removed), nothing else."""
    table = render_table(parts)
    head = f"table {TABLE}\ndelete table {TABLE}\n"
    return head + table


def is_loopback(host: str) -> bool:
    """Whether a listener on ``host`` is reachable from this machine only (then it needs no rule)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def server_part(
    name: str,
    *,
    enabled: bool,
    networks: Sequence[str],
    http: tuple[str, int],
    agent_server: tuple[str, int],
    peers: Iterable[str],
) -> FirewallPart:
    """A control plane's part: HTTP from ``networks`` (all when empty); the agent port from ``peers``."""
    rules = []
    if not is_loopback(http[0]):
        rules.append(open_rule(http[1], networks, "HTTP (/v1, /api, portal, /metrics)"))
    if not is_loopback(agent_server[0]):
        rules.append(
            peer_rule(agent_server[1], agent_server[1], peers, "agent server (nodes, control planes)")
        )
    return FirewallPart(f"server-{name}", enabled, tuple(rules) if enabled else ())


def agent_part(
    node_id: str, *, enabled: bool, address: str, ports: tuple[int, int], control_planes: Iterable[str]
) -> FirewallPart:
    """A node's part: its engines' ports from the control planes only (and loopback)."""
    rules = []
    if not is_loopback(address):
        rules.append(peer_rule(ports[0], ports[1], control_planes, "engines (control planes only)"))
    return FirewallPart(f"agent-{node_id}", enabled, tuple(rules) if enabled else ())
