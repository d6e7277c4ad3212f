"""llmgw's nftables table, rendered from each process's part (C10.2)."""

from __future__ import annotations

from llmgw.core.settingtypes import FIREWALL_ENABLED, FIREWALL_NETWORKS, value_problem
from llmgw.operations.firewall import (
    FirewallPart,
    agent_part,
    normalized,
    render_table,
    ruleset_file,
    server_part,
)


def _server(**kwargs: object) -> FirewallPart:
    options: dict[str, object] = {
        "enabled": True,
        "networks": [],
        "http": ("10.0.0.1", 8080),
        "agent_server": ("10.0.0.1", 8443),
        "peers": ["10.0.0.2", "10.0.0.3"],
    }
    options.update(kwargs)
    return server_part("cp1", **options)  # type: ignore[arg-type]


def test_http_is_open_to_anyone_without_networks_and_the_agent_port_to_peers_only() -> None:
    table = render_table([_server()])
    assert 'tcp dport 8080 accept comment "server-cp1: HTTP' in table
    assert "tcp dport 8443 ip saddr { 10.0.0.2, 10.0.0.3 } accept" in table
    assert "tcp dport 8443 reject with tcp reset" in table
    assert "tcp dport 8080 reject" not in table


def test_http_is_open_to_the_networks_configured_only() -> None:
    table = render_table([_server(networks=["192.168.1.0/24", "fd00::/64"])])
    assert "tcp dport 8080 ip saddr { 192.168.1.0/24 } accept" in table
    assert "tcp dport 8080 ip6 saddr { fd00::/64 } accept" in table
    assert "tcp dport 8080 reject with tcp reset" in table


def test_loopback_and_established_connections_pass_before_any_refusal() -> None:
    lines = render_table([_server()]).splitlines()
    first_reject = next(i for i, line in enumerate(lines) if "reject" in line)
    assert lines.index('        iifname "lo" accept') < first_reject
    assert lines.index("        ct state established,related accept") < first_reject


def test_every_accept_of_every_part_comes_before_any_refusal() -> None:
    node = agent_part(
        "n1", enabled=True, address="10.0.0.2", ports=(21000, 21999), control_planes=["10.0.0.1"]
    )
    lines = render_table([node, _server()]).splitlines()
    accepts = [i for i, line in enumerate(lines) if "dport" in line and "accept" in line]
    rejects = [i for i, line in enumerate(lines) if "reject" in line]
    assert len(accepts) == 3 and len(rejects) == 2
    assert max(accepts) < min(rejects)


def test_engine_ports_are_reachable_from_control_planes_only() -> None:
    node = agent_part(
        "n1", enabled=True, address="10.0.0.2", ports=(21000, 21999), control_planes=["10.0.0.1", "10.0.0.9"]
    )
    table = render_table([node])
    assert "tcp dport 21000-21999 ip saddr { 10.0.0.1, 10.0.0.9 } accept" in table
    assert "tcp dport 21000-21999 reject with tcp reset" in table


def test_a_node_that_knows_no_control_plane_lets_only_loopback_reach_its_engines() -> None:
    node = agent_part("n1", enabled=True, address="10.0.0.2", ports=(21000, 21999), control_planes=[])
    table = render_table([node])
    assert "21000-21999 ip saddr" not in table
    assert "tcp dport 21000-21999 reject with tcp reset" in table


def test_ports_on_loopback_need_no_rule() -> None:
    server = _server(http=("127.0.0.1", 8080), agent_server=("::1", 8443))
    node = agent_part("n1", enabled=True, address="127.0.0.1", ports=(21000, 21999), control_planes=[])
    assert server.rules == () and node.rules == ()
    assert render_table([server, node]) == ""


def test_a_disabled_part_adds_no_rule_and_no_table_remains() -> None:
    assert render_table([_server(enabled=False)]) == ""
    assert ruleset_file([_server(enabled=False)]) == "table inet llmgw\ndelete table inet llmgw\n"


def test_the_file_replaces_only_llmgws_table_in_one_go() -> None:
    text = ruleset_file([_server()])
    head = text.splitlines()[:3]
    assert head == ["table inet llmgw", "delete table inet llmgw", "table inet llmgw {"]
    assert "flush ruleset" not in text
    assert [line for line in text.splitlines() if line.startswith("table")] == [
        "table inet llmgw",
        "table inet llmgw {",
    ]


def test_sources_are_normalized_and_what_is_not_an_address_is_left_out() -> None:
    assert normalized(["10.0.0.3", "10.0.0.3", "10.1.0.0/16", "bad", "fd00::1", " 10.0.0.2 "]) == (
        "10.0.0.2",
        "10.0.0.3",
        "10.1.0.0/16",
        "fd00::1",
    )


def test_a_part_goes_to_json_and_back_unchanged() -> None:
    part = _server(networks=["192.168.0.0/16"])
    assert FirewallPart.from_json(part.to_json()) == part


def test_the_firewall_settings_take_their_types_only() -> None:
    assert value_problem(FIREWALL_ENABLED, False) == ""
    assert "JSON bool" in value_problem(FIREWALL_ENABLED, "false")
    assert value_problem(FIREWALL_NETWORKS, ["10.0.0.0/8", "fd00::1"]) == ""
    assert "array of addresses" in value_problem(FIREWALL_NETWORKS, ["10.0.0.0/8", "everyone"])
    assert "array of addresses" in value_problem(FIREWALL_NETWORKS, "10.0.0.0/8")


def test_a_node_named_like_a_verdict_gets_one_accept_and_one_refusal() -> None:
    node = agent_part(
        "reject-accept", enabled=True, address="10.0.0.2", ports=(21000, 21999), control_planes=["10.0.0.1"]
    )
    lines = [line for line in render_table([node]).splitlines() if "dport" in line]
    assert len(lines) == 2
    assert " accept comment" in lines[0] and " reject with tcp reset" in lines[1]
