"""server add: another control plane's certificate, configuration and keepalived file."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.controlplane.config import ServerConfig, load_server_config
from llmgw.errors import ConfigError
from llmgw.provisioning.clusters import add_control_plane, initialise

POSTGRES = "postgresql+asyncpg://llmgw@10.0.0.5/llmgw"


@pytest.fixture
def cluster(tmp_path: Path) -> ServerConfig:
    config = initialise(
        tmp_path / "cp1",
        name="cp1",
        http_host="127.0.0.1",
        http_port=8080,
        agent_host="127.0.0.1",
        agent_port=8443,
    )
    config.store.url = POSTGRES  # as if moved to PostgreSQL: server add only writes files
    return config


def test_server_add_writes_a_control_plane_on_the_same_store(cluster: ServerConfig, tmp_path: Path) -> None:
    directory = tmp_path / "cp2"
    add_control_plane(
        cluster,
        directory,
        name="cp2",
        http_host="10.0.0.11",
        http_port=8080,
        agent_host="10.0.0.11",
        agent_port=8443,
    )
    added = load_server_config(directory / "server.yaml")
    assert (added.name, added.store_url, added.admin_token_sha256) == (
        "cp2",
        POSTGRES,
        cluster.admin_token_sha256,
    )
    assert (added.http.host, added.agent_server.host) == ("10.0.0.11", "10.0.0.11")
    certificate = x509.load_pem_x509_certificate((directory / "server.crt").read_bytes())
    assert certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "cp2"
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
    assert (directory / "ca.crt").read_bytes() == (tmp_path / "cp1" / "ca.crt").read_bytes()
    assert (directory / "admin.token").read_text() == (tmp_path / "cp1" / "admin.token").read_text()
    assert not (directory / "keepalived.conf").exists()


def test_server_add_with_vip_writes_keepalived_following_leader(
    cluster: ServerConfig, tmp_path: Path
) -> None:
    directory = tmp_path / "cp2"
    add_control_plane(
        cluster,
        directory,
        name="cp2",
        http_host="10.0.0.11",
        http_port=8081,
        agent_host="10.0.0.11",
        agent_port=8443,
        vip="10.0.0.100",
        interface="ens5",
    )
    text = (directory / "keepalived.conf").read_text()
    assert "http://10.0.0.11:8081/leader" in text
    assert "10.0.0.100/32" in text and "interface ens5" in text
    assert load_server_config(directory / "server.yaml").leadership.vip == "10.0.0.100"


def test_server_add_refuses_a_sqlite_store(tmp_path: Path) -> None:
    config = initialise(
        tmp_path / "cp1",
        name="cp1",
        http_host="127.0.0.1",
        http_port=8080,
        agent_host="127.0.0.1",
        agent_port=8443,
    )
    with pytest.raises(ConfigError, match="SQLite") as refused:
        add_control_plane(
            config, tmp_path / "cp2", name="cp2", http_host="h", http_port=1, agent_host="h", agent_port=2
        )
    assert "PostgreSQL" in refused.value.hint


def test_server_add_refuses_a_vip_that_is_no_address(cluster: ServerConfig, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an IP address"):
        add_control_plane(
            cluster,
            tmp_path / "cp2",
            name="cp2",
            http_host="h",
            http_port=1,
            agent_host="h",
            agent_port=2,
            vip="vip",
        )


def test_server_add_keeps_the_clusters_http_limits(cluster: ServerConfig, tmp_path: Path) -> None:
    cluster.http.header_timeout_s = 3.5
    cluster.http.max_connections = 900
    add_control_plane(
        cluster,
        tmp_path / "cp2",
        name="cp2",
        http_host="10.0.0.11",
        http_port=8081,
        agent_host="10.0.0.11",
        agent_port=8443,
    )
    added = load_server_config(tmp_path / "cp2" / "server.yaml")
    assert (added.http.host, added.http.port) == ("10.0.0.11", 8081)
    assert (added.http.header_timeout_s, added.http.max_connections) == (3.5, 900)


def test_server_add_gives_both_planes_one_store_key_though_the_first_made_none_yet(
    cluster: ServerConfig, tmp_path: Path
) -> None:
    """A cluster made before engine keys were sealed has no key file until its first start: the one
    server add makes is the first plane's too, so neither is refused for holding another."""
    first = tmp_path / "cp1" / "store-secrets.key"
    first.unlink()
    directory = tmp_path / "cp2"
    add_control_plane(
        cluster,
        directory,
        name="cp2",
        http_host="10.0.0.11",
        http_port=8080,
        agent_host="10.0.0.11",
        agent_port=8443,
    )
    assert first.exists() and (directory / "store-secrets.key").read_bytes() == first.read_bytes()
    assert first.stat().st_mode & 0o777 == 0o600
