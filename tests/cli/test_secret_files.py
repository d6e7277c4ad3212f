"""Secret files are 0600 whatever the umask; a node certificate never passes for a control plane."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.controlplane.config import ServerConfig
from llmgw.errors import ConfigError
from llmgw.pki.authority import serves
from llmgw.provisioning.clusters import add_control_plane, initialise, issue_node_certificate

POSTGRES = "postgresql+asyncpg://llmgw:secret@10.0.0.5/llmgw"


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """A umask that would leave new files readable by everyone (0644) unless written with a mode."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def cluster(tmp_path: Path) -> ServerConfig:
    return initialise(
        tmp_path / "cp1",
        name="cp1",
        http_host="127.0.0.1",
        http_port=8080,
        agent_host="127.0.0.1",
        agent_port=8443,
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_server_init_writes_its_secrets_owner_only(cluster: ServerConfig, tmp_path: Path) -> None:
    directory = tmp_path / "cp1"
    secrets = ("server.yaml", "admin.token", "ca.key", "server.key", "store-secrets.key", "llmgw.db")
    assert {name: mode(directory / name) for name in secrets} == dict.fromkeys(secrets, 0o600)
    assert mode(directory / "ca.crt") == 0o644


def test_server_add_copies_the_ca_key_store_key_and_token_owner_only(
    cluster: ServerConfig, tmp_path: Path
) -> None:
    cluster.store.url = POSTGRES  # server.yaml now holds the store's password
    directory = tmp_path / "cp2"
    add_control_plane(
        cluster,
        directory,
        name="cp2",
        http_host="10.0.0.11",
        http_port=8080,
        agent_host="10.0.0.11",
        agent_port=8443,
        vip="10.0.0.100/24",
    )
    secrets = ("server.yaml", "admin.token", "ca.key", "store-secrets.key", "keepalived.conf")
    assert {name: mode(directory / name) for name in secrets} == dict.fromkeys(secrets, 0o600)
    for shared in ("ca.key", "store-secrets.key"):  # every plane of the cluster holds the same
        assert (directory / shared).read_bytes() == (tmp_path / "cp1" / shared).read_bytes()
    assert not [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_node_certificate_is_refused_under_a_control_planes_name(
    cluster: ServerConfig, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="control plane") as refused:
        issue_node_certificate(cluster, "cp1", tmp_path / "node")
    assert "name of its own" in refused.value.hint
    assert not (tmp_path / "node" / "node.key").exists()


def test_node_certificate_is_client_only_and_a_control_planes_serves(
    cluster: ServerConfig, tmp_path: Path
) -> None:
    issue_node_certificate(cluster, "gpu-1", tmp_path / "node")
    assert mode(tmp_path / "node" / "node.key") == 0o600
    assert not serves((tmp_path / "node" / "node.crt").read_bytes())
    assert serves((tmp_path / "cp1" / "server.crt").read_bytes())
    assert not serves(b"not a certificate")
