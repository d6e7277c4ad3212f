"""Certificates for the protocol's tests: a cluster CA as ``llmgw server init`` makes it, on 127.0.0.1."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llmgw.pki.authority import Authority
from llmgw.protocol.grpc_transport import SERVER_NAME, TlsFiles


@dataclass(frozen=True)
class Pki:
    authority: Authority
    server: TlsFiles
    node: TlsFiles
    stranger: TlsFiles
    """A node certificate with the right CA file but signed by another CA."""


def make_pki(tmp_path: Path) -> Pki:
    """A cluster CA in ``tmp_path`` with a control plane's and a node's certificates, and a stranger's."""
    authority = Authority.create(tmp_path / "ca")
    ca = authority.certificate_path
    server_cert, server_key = authority.issue(
        "cp1", sans=[SERVER_NAME, "127.0.0.1"], usage="both", directory=tmp_path / "cp1", stem="server"
    )
    node_cert, node_key = authority.issue(
        "node-1", sans=[], usage="client", directory=tmp_path / "n1", stem="node"
    )
    other = Authority.create(tmp_path / "other-ca")
    stranger_cert, stranger_key = other.issue(
        "node-1", sans=[], usage="client", directory=tmp_path / "stranger", stem="node"
    )
    return Pki(
        authority=authority,
        server=TlsFiles(ca, server_cert, server_key),
        node=TlsFiles(ca, node_cert, node_key),
        stranger=TlsFiles(ca, stranger_cert, stranger_key),
    )
