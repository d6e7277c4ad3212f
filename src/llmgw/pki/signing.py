"""Signing releases: ed25519 keys, raw 64-byte signatures, verification against a trusted key.

The release key pair is made once (``llmgw release keygen``); its private half
signs a release's ``SHA256SUMS`` (``make release KEY=...``), its public half is
the ``trusted.pub`` every control plane and node keeps beside its config. Both
halves are PEM files; the private one is written 0600 from its first byte.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from llmgw.errors import ConfigError, UntrustedRelease
from llmgw.runtime.files import write_private, write_public

SIGNATURE_SIZE = 64
"""Bytes of an ed25519 signature."""


def generate_signing_key(private_path: Path, public_path: Path) -> None:
    """Make a key pair: the private key at ``private_path`` (PEM, 0600), the public one beside (PEM)."""
    for path in (private_path, public_path):
        if path.exists():
            raise ConfigError(
                f"{path} already exists",
                hint="remove it first, or give other paths: replacing a release key "
                "means giving every node the new public key",
            )
    key = Ed25519PrivateKey.generate()
    write_private(
        private_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    write_public(public_path, public_key_pem(key.public_key()))


def public_key_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private_key(private_key_path: Path) -> Ed25519PrivateKey:
    """The ed25519 private key in ``private_key_path``; ConfigError naming the file otherwise."""
    try:
        data = private_key_path.read_bytes()
    except OSError as error:
        raise ConfigError(
            f"cannot read the signing key {private_key_path}: {error.strerror or error}",
            hint="give the private key 'llmgw release keygen' wrote",
        ) from error
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"{private_key_path} is not an unencrypted PEM private key",
            hint="give the private key 'llmgw release keygen' wrote",
        ) from error
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            f"{private_key_path} is not an ed25519 key",
            hint="release keys are ed25519: make one with 'llmgw release keygen'",
        )
    return key


def load_public_key(trusted_public_key: bytes, where: str = "the trusted key") -> Ed25519PublicKey:
    """The ed25519 public key in PEM bytes; ConfigError saying what is wrong otherwise."""
    try:
        key = serialization.load_pem_public_key(trusted_public_key)
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"{where} is not a PEM public key",
            hint="give the release key's public half (trusted.pub, from 'llmgw release keygen')",
        ) from error
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(
            f"{where} is not an ed25519 public key",
            hint="give the release key's public half (trusted.pub, from 'llmgw release keygen')",
        )
    return key


def sign(data: bytes, private_key_path: Path) -> bytes:
    """The raw 64-byte ed25519 signature of ``data`` by the key in ``private_key_path``."""
    return load_private_key(private_key_path).sign(data)


def verify(data: bytes, signature: bytes, trusted_public_key: bytes) -> None:
    """Return if ``signature`` is the trusted key's over ``data``; UntrustedRelease otherwise."""
    key = load_public_key(trusted_public_key)
    if not signature:
        raise UntrustedRelease(
            "the release is not signed",
            hint="use a release made with 'make release KEY=...', whose SHA256SUMS.sig is signed by the "
            "key this machine trusts",
        )
    if len(signature) != SIGNATURE_SIZE:
        raise UntrustedRelease(
            f"the release's signature is {len(signature)} bytes, not an ed25519 signature's {SIGNATURE_SIZE}",
            hint="the signature file is damaged or not one; fetch the release again from its source",
        )
    try:
        key.verify(signature, data)
    except InvalidSignature as error:
        raise UntrustedRelease(
            "the release's signature does not match: altered, or signed by a key this machine does not trust",
            hint="fetch the release again from its source; if it was signed by a new key, put that key's "
            "public half in release.trusted_pub",
        ) from error
