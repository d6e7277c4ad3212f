"""Secrets the store keeps, encrypted at rest with a key only the control planes hold.

The engines' keys (``replicas.api_key``) let whoever holds one talk to an
engine directly, past keys, limits and usage, so a copy of the database (a
backup, a readable SQLite file) must not give them away. :class:`SecretBox`
seals each such value with AES-256-GCM under the cluster's store key, bound
to the row it belongs to (its table, column and id, as associated data: a
sealed value moved to another row does not open), and stores it as
``enc1:`` followed by the nonce and ciphertext in URL-safe base64. A value
without the prefix is a row written before encryption came in; it reads as
it is and is sealed the next time it is written.

The key lives in ``store-secrets.key`` beside ``server.yaml`` (0600, 32
random bytes in base64): :func:`load_or_create` makes it at a control plane's
first start; ``llmgw server add`` copies it to the cluster's other control
planes with the CA, and every plane of one cluster must hold the same. Values
are opened where rows are read into memory (a reconcile pass, a new leader's
replicas), never per request, and each is opened once (:attr:`SecretBox.opened`).
"""

from __future__ import annotations

import base64
import binascii
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from llmgw.errors import ConfigError, StoreError
from llmgw.runtime.files import write_private

PREFIX = "enc1:"
"""The mark of a sealed value (version 1: AES-256-GCM, 12-byte nonce)."""

KEY_FILE = "store-secrets.key"
"""The store key's file name, beside server.yaml."""

NONCE_BYTES = 12
OPENED_KEPT = 100_000
"""Opened values kept at most (a value is opened once, then read from here)."""

WRONG_KEY_HINT = (
    f"every control plane of a cluster must hold the same {KEY_FILE} (beside server.yaml): copy it from "
    "another control plane of the cluster, as 'llmgw server add' does"
)


class SecretBox:
    """Seals and opens the store's secret values with one key."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ConfigError(
                f"the store key is {len(key)} bytes long, not 32",
                f"restore {KEY_FILE} from another control plane of the cluster",
            )
        self._aead = AESGCM(key)
        self.opened: dict[tuple[str, str], str] = {}
        """Opened values by (sealed value, row): a value is decrypted once."""

    @staticmethod
    def new_key() -> bytes:
        return AESGCM.generate_key(bit_length=256)

    def seal(self, plain: str, row: str) -> str:
        """``plain`` sealed for ``row`` (e.g. ``replicas.api_key:ID``), as stored."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = nonce + self._aead.encrypt(nonce, plain.encode(), row.encode())
        return PREFIX + base64.urlsafe_b64encode(sealed).decode().rstrip("=")

    def open(self, stored: str, row: str) -> str:
        """The plain value of ``stored`` (read as it is when not sealed); :class:`StoreError` when it was
        sealed under another key or for another row."""
        if not stored.startswith(PREFIX):
            return stored
        cached = self.opened.get((stored, row))
        if cached is not None:
            return cached
        text = stored[len(PREFIX) :]
        try:
            sealed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            plain = self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], row.encode()).decode()
        except (InvalidTag, ValueError, binascii.Error):
            raise StoreError(
                f"the store's secret of {row.rpartition(':')[0] or row} cannot be opened with this "
                "control plane's store key",
                WRONG_KEY_HINT,
            ) from None
        if len(self.opened) >= OPENED_KEPT:
            self.opened.clear()
        self.opened[(stored, row)] = plain
        return plain


def sealed(stored: str) -> bool:
    """Whether a stored value is sealed."""
    return stored.startswith(PREFIX)


def open_plain(stored: str, row: str) -> str:
    """What a store without a key reads: a plain value as it is; a sealed one is an error."""
    if sealed(stored):
        raise StoreError(
            f"the store's secret of {row.rpartition(':')[0] or row} is encrypted and this store was "
            "opened without the store key",
            f"open it as a control plane does, with {KEY_FILE} beside server.yaml",
        )
    return stored


def load_or_create(path: Path) -> SecretBox:
    """The store key in ``path``, made (0600) when there is none yet."""
    if not path.exists():
        key = SecretBox.new_key()
        write_private(path, base64.urlsafe_b64encode(key) + b"\n")
        return SecretBox(key)
    return SecretBox(read_key(path))


def read_key(path: Path) -> bytes:
    """The key in ``path``; :class:`ConfigError` saying what to do when it cannot be read."""
    try:
        text = path.read_bytes().strip()
    except OSError as error:
        raise ConfigError(
            f"cannot read the store key {path}: {error.strerror or error}",
            f"check its owner and mode (0600, the control plane's user), or {WRONG_KEY_HINT}",
        ) from error
    try:
        key = base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))
    except (ValueError, binascii.Error):
        raise ConfigError(f"{path} holds no store key", WRONG_KEY_HINT) from None
    if len(key) != 32:
        raise ConfigError(f"{path} holds no store key (not 32 bytes)", WRONG_KEY_HINT)
    return key
