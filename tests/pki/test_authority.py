"""The cluster CA: issuing, loading, file modes and a real mutual-TLS handshake."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from llmgw.errors import ConfigError
from llmgw.pki.authority import Authority, common_name_of


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority.create(tmp_path / "ca")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_create_writes_a_p256_ca_with_a_private_key_file(authority: Authority) -> None:
    certificate = _load(authority.certificate_path)
    assert certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    public = certificate.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    assert _mode(authority.key_path) == 0o600
    assert authority.name == "llmgw cluster CA"


def test_create_refuses_to_overwrite_an_existing_ca(authority: Authority) -> None:
    with pytest.raises(ConfigError, match="already exists"):
        Authority.create(authority.directory)


def test_load_reads_back_the_same_ca(authority: Authority) -> None:
    loaded = Authority.load(authority.directory)
    assert loaded.certificate == authority.certificate


def test_load_of_a_missing_ca_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ca\.crt is missing"):
        Authority.load(tmp_path)


def test_ca_is_valid_for_ten_years(authority: Authority) -> None:
    span = authority.certificate.not_valid_after_utc - authority.certificate.not_valid_before_utc
    assert span.days == 3650


def test_issued_certificate_verifies_against_the_ca(authority: Authority, tmp_path: Path) -> None:
    cert_path, _ = authority.issue(
        "node-1", sans=["node-1.example", "10.0.0.7"], usage="client", directory=tmp_path, stem="node"
    )
    certificate = _load(cert_path)
    certificate.verify_directly_issued_by(authority.certificate)  # raises when it does not
    span = certificate.not_valid_after_utc - certificate.not_valid_before_utc
    assert span.days == 730


def test_issued_certificate_carries_dns_and_ip_sans(authority: Authority, tmp_path: Path) -> None:
    cert_path, _ = authority.issue(
        "cp", sans=["cp.example", "127.0.0.1", "::1"], usage="server", directory=tmp_path, stem="cp"
    )
    sans = _load(cert_path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["cp.example"]
    assert sans.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ("server", {ExtendedKeyUsageOID.SERVER_AUTH}),
        ("client", {ExtendedKeyUsageOID.CLIENT_AUTH}),
        ("both", {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}),
    ],
)
def test_issued_certificate_carries_its_usage(
    authority: Authority, tmp_path: Path, usage: str, expected: set[x509.ObjectIdentifier]
) -> None:
    cert_path, _ = authority.issue("x", sans=[], usage=usage, directory=tmp_path, stem="x")  # type: ignore[arg-type]
    extensions = _load(cert_path).extensions
    assert set(extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == expected
    assert not extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key_usage = extensions.get_extension_for_class(x509.KeyUsage).value
    assert key_usage.digital_signature and not key_usage.key_cert_sign


def test_issued_key_file_is_readable_by_its_owner_only(authority: Authority, tmp_path: Path) -> None:
    cert_path, key_path = authority.issue("x", sans=[], usage="both", directory=tmp_path, stem="x")
    assert (cert_path.name, key_path.name) == ("x.crt", "x.key")
    assert _mode(key_path) == 0o600


def test_unknown_usage_is_refused(authority: Authority, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="usage"):
        authority.issue("x", sans=[], usage="peer", directory=tmp_path, stem="x")  # type: ignore[arg-type]


def test_common_name_of_reads_the_subject(authority: Authority, tmp_path: Path) -> None:
    cert_path, _ = authority.issue("node-42", sans=[], usage="client", directory=tmp_path, stem="n")
    assert common_name_of(cert_path.read_bytes()) == "node-42"


def test_common_name_of_refuses_bytes_that_are_no_certificate() -> None:
    with pytest.raises(ConfigError, match="not a PEM certificate"):
        common_name_of(b"hello")


async def _handshake(authority: Authority, client_ca: Authority, tmp_path: Path) -> bytes:
    """Run a mutual-TLS echo server; return what a client with a cert from ``client_ca`` reads back."""
    server_crt, server_key = authority.issue(
        "control-plane", sans=["localhost", "127.0.0.1"], usage="server", directory=tmp_path, stem="server"
    )
    client_crt, client_key = client_ca.issue(
        "node-1", sans=[], usage="client", directory=tmp_path, stem=f"client-{client_ca.directory.name}"
    )
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=authority.certificate_path)
    server_context.load_cert_chain(server_crt, server_key)
    server_context.verify_mode = ssl.CERT_REQUIRED
    client_context = ssl.create_default_context(cafile=authority.certificate_path)
    for context in (server_context, client_context):
        context.verify_flags |= ssl.VERIFY_X509_STRICT  # the checks newer Pythons make by default
    client_context.load_cert_chain(client_crt, client_key)
    peers: list[str] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert")
        peers.append(dict(item[0] for item in peer["subject"])["commonName"])
        writer.write(await reader.readexactly(4))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context, server_hostname="127.0.0.1"
        )
        try:
            writer.write(b"ping")
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(4), 5)
        finally:
            writer.close()
    finally:
        server.close()
    assert peers == ([common_name_of(client_crt.read_bytes())] if answer else [])
    return answer


async def test_tls_handshake_accepts_a_client_cert_from_the_same_ca(
    authority: Authority, tmp_path: Path
) -> None:
    assert await _handshake(authority, authority, tmp_path) == b"ping"


async def test_tls_handshake_refuses_a_client_cert_from_another_ca(
    authority: Authority, tmp_path: Path
) -> None:
    stranger = Authority.create(tmp_path / "other", name="someone else's CA")
    try:
        answer = await _handshake(authority, stranger, tmp_path)
    except (ssl.SSLError, ConnectionError):
        answer = b""  # TLS 1.2 fails in the handshake; TLS 1.3 closes after it
    assert answer == b""


def test_load_refuses_a_key_that_does_not_match_the_certificate(authority: Authority, tmp_path: Path) -> None:
    other = Authority.create(tmp_path / "other")
    authority.key_path.write_bytes(other.key_path.read_bytes())
    with pytest.raises(ConfigError, match="not the private key"):
        Authority.load(authority.directory)
