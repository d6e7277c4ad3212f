"""Whether a certificate a machine already holds can stay, or must be issued again.

It stays when this cluster's CA signed it, it names the machine, it has the
uses the machine needs (a node: client; a control plane: server and client),
it covers every address the machine is reached at, and it is valid for at
least :data:`RENEW_BEFORE` more. An older control plane certificate without
client use (standbys relay to the leader with it) or without a new address
is therefore reissued.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

RENEW_BEFORE = timedelta(days=30)
"""A certificate with less validity left than this is reissued."""

_NEEDS = {
    "client": {ExtendedKeyUsageOID.CLIENT_AUTH},
    "server": {ExtendedKeyUsageOID.SERVER_AUTH},
    "both": {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH},
}


def problems(
    pem: bytes,
    ca_pem: bytes,
    *,
    name: str,
    usage: str,
    sans: Iterable[str] = (),
    now: datetime | None = None,
) -> list[str]:
    """What keeps ``pem`` from serving as ``name``'s certificate for ``usage``; empty when nothing."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        return ["it is not a PEM certificate"]
    found: list[str] = []
    key = ca.public_key()
    try:
        if not isinstance(key, ec.EllipticCurvePublicKey) or cert.issuer != ca.subject:
            raise InvalidSignature
        hash_algorithm = cert.signature_hash_algorithm
        assert hash_algorithm is not None
        key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hash_algorithm))
    except (InvalidSignature, AssertionError):
        found.append("another CA signed it")
    names = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if names != [name]:
        found.append(f"it names {', '.join(map(str, names)) or 'nobody'}, not {name}")
    try:
        uses = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        uses = set()
    if missing := _NEEDS[usage] - uses:
        found.append("it lacks " + " and ".join(sorted(oid._name for oid in missing)))
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        covered = {str(v) for v in alt.get_values_for_type(x509.DNSName)}
        covered |= {str(v) for v in alt.get_values_for_type(x509.IPAddress)}
    except x509.ExtensionNotFound:
        covered = set()
    if missing_names := sorted(set(sans) - covered):
        found.append(f"it does not cover {', '.join(missing_names)}")
    if cert.not_valid_after_utc - (now or datetime.now(UTC)) < RENEW_BEFORE:
        found.append(f"it expires {cert.not_valid_after_utc:%Y-%m-%d}")
    return found
