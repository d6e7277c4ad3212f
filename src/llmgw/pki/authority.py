"""The cluster's certificate authority: one CA signs the control plane's and agents' certificates.

Keys are ECDSA P-256 (gRPC's BoringSSL and every TLS stack accept it). The CA
lives in a directory as ``ca.crt`` and ``ca.key`` (0600) and is valid for ten
years; certificates it issues are valid for two. Both carry the extensions a
strict verifier asks for (key identifiers, key usage, critical basic
constraints), so Python's and Go's default TLS settings accept them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.errors import ConfigError
from llmgw.runtime.files import write_private, write_public

Usage = Literal["server", "client", "both"]

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CA_VALIDITY = timedelta(days=3650)
"""How long the cluster CA is valid: ten years."""
LEAF_VALIDITY = timedelta(days=730)
"""How long an issued certificate is valid: two years."""
CLOCK_SKEW = timedelta(minutes=5)
"""Certificates start this long before now, so a node whose clock is behind accepts them."""

_USAGES: dict[str, tuple[x509.ObjectIdentifier, ...]] = {
    "server": (ExtendedKeyUsageOID.SERVER_AUTH,),
    "client": (ExtendedKeyUsageOID.CLIENT_AUTH,),
    "both": (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
}


@dataclass(frozen=True)
class Authority:
    """A loaded CA: its certificate, its private key and the directory holding them."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    directory: Path

    @property
    def certificate_path(self) -> Path:
        return self.directory / CA_CERT

    @property
    def key_path(self) -> Path:
        return self.directory / CA_KEY

    @property
    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def name(self) -> str:
        return common_name_of(self.certificate_pem)

    @classmethod
    def create(
        cls, directory: Path, name: str = "llmgw cluster CA", *, now: datetime | None = None
    ) -> Authority:
        """Make a new CA in ``directory``; refuses to overwrite one that is there."""
        directory = Path(directory)
        if (directory / CA_KEY).exists() or (directory / CA_CERT).exists():
            raise ConfigError(
                f"a certificate authority already exists in {directory}",
                hint="load it instead, or move the directory away to start a new cluster CA "
                "(every node will then need new certificates)",
            )
        start = (now or datetime.now(UTC)) - CLOCK_SKEW
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        public = key.public_key()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(signs_certificates=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        write_private(directory / CA_KEY, _key_pem(key))
        write_public(directory / CA_CERT, certificate.public_bytes(serialization.Encoding.PEM))
        return cls(certificate, key, directory)

    @classmethod
    def load(cls, directory: Path) -> Authority:
        """Read the CA in ``directory``."""
        directory = Path(directory)
        try:
            cert_pem = (directory / CA_CERT).read_bytes()
            key_pem = (directory / CA_KEY).read_bytes()
        except FileNotFoundError as error:
            raise ConfigError(
                f"no certificate authority in {directory}: {Path(error.filename).name} is missing",
                hint="create one with Authority.create (llmgw server run does on first start) "
                "or point to the directory holding ca.crt and ca.key",
            ) from error
        try:
            certificate = x509.load_pem_x509_certificate(cert_pem)
            key = serialization.load_pem_private_key(key_pem, password=None)
        except ValueError as error:
            raise ConfigError(
                f"the certificate authority in {directory} cannot be read: {error}",
                hint="restore ca.crt and ca.key from a backup",
            ) from error
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != certificate.public_key():
            raise ConfigError(
                f"{directory / CA_KEY} is not the private key of {directory / CA_CERT}",
                hint="restore the matching pair from a backup",
            )
        return cls(certificate, key, directory)

    def issue(
        self,
        common_name: str,
        *,
        sans: Iterable[str],
        usage: Usage,
        directory: Path,
        stem: str,
        now: datetime | None = None,
    ) -> tuple[Path, Path]:
        """Issue a certificate and key; write ``<stem>.crt`` and ``<stem>.key`` (0600) in ``directory``.

        ``sans`` mixes DNS names and IP addresses; each goes into the subject
        alternative names as the kind it is.
        """
        if usage not in _USAGES:
            raise ConfigError(f"unknown certificate usage {usage!r}", hint="use 'server', 'client' or 'both'")
        start = (now or datetime.now(UTC)) - CLOCK_SKEW
        end = min(start + LEAF_VALIDITY, self.certificate.not_valid_after_utc)
        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.certificate.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(signs_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(_USAGES[usage])), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        names = _general_names(sans)
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        directory = Path(directory)
        key_path = write_private(directory / f"{stem}.key", _key_pem(key))
        cert_path = write_public(
            directory / f"{stem}.crt", certificate.public_bytes(serialization.Encoding.PEM)
        )
        return cert_path, key_path


def common_name_of(cert_pem: bytes) -> str:
    """The subject common name of a PEM certificate (how nodes are named in mTLS)."""
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as error:
        raise ConfigError(
            f"not a PEM certificate: {error}", hint="pass the certificate's PEM bytes (-----BEGIN ...)"
        ) from error
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ConfigError(
            "the certificate has no common name", hint="issue it with the cluster CA, which always sets one"
        )
    value = names[0].value
    return value if isinstance(value, str) else value.decode()


def serves(cert_pem: bytes) -> bool:
    """True for a certificate issued for server use: a control plane's. Nodes' certificates are client-only.

    The leader answers relayed requests only from such certificates, so a node
    certificate can never pass for a control plane, whatever its common name.
    """
    try:
        certificate = x509.load_pem_x509_certificate(cert_pem)
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    return ExtendedKeyUsageOID.SERVER_AUTH in usages


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _general_names(sans: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for san in sans:
        text = san.strip()
        if not text:
            continue
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(text)))
        except ValueError:
            names.append(x509.DNSName(text))
    return names
