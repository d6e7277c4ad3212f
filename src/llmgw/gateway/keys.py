"""API keys as the gateway knows them: in memory, by the sha256 of the secret.

The control plane owns keys (they live in the store); it hands the gateway a
:class:`KeyEntry` per key and keeps the :class:`KeyRing` current with
:meth:`KeyRing.replace`, :meth:`KeyRing.add` and :meth:`KeyRing.remove`. A
request's key is checked by hashing the presented secret and looking the hash
up: no database call, and no secret kept in clear. The entry carries the key's
:class:`~llmgw.core.tenancy.Place`, which decides what models the key sees.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from llmgw.core.tenancy import NOWHERE, Place


def hash_secret(secret: str | bytes) -> str:
    """The sha256 hex digest of a whole secret, as :attr:`KeyEntry.secret_hash` holds it."""
    raw = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One API key that may call ``/v1``."""

    key_id: str
    """The key's stable id (what usage is counted under)."""
    name: str
    """A human name for the key."""
    secret_hash: str
    """sha256 hex digest of the whole secret (:func:`hash_secret`)."""
    owner: str | None = None
    """A label saying who uses the key (no bearing on what it sees)."""
    place: Place = NOWHERE
    """Where the key sits (its project, or its user and the user's teams and organizations): it sees
    public models and adapters and those owned at or above it (:func:`llmgw.core.tenancy.visible`)."""
    collections: tuple[str, ...] = ()
    """Knowledge collections its chat and Responses requests search when they name none
    (docs/knowledge.md); empty: none."""
    project: str = field(init=False, compare=False)
    """What its requests count under in metrics, logs and usage: where it sits as text
    (``project:ORG/TEAM/PROJECT``, ``user:NAME``), empty when nowhere; made once, not per request."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "project", "" if self.place.at.public else str(self.place.at))


class KeyRing:
    """The keys that may call the gateway, looked up by the hash of their secret."""

    def __init__(self, entries: Iterable[KeyEntry] = ()) -> None:
        self._by_hash: dict[str, KeyEntry] = {}
        self._hash_of: dict[str, str] = {}
        self.replace(entries)

    def replace(self, entries: Iterable[KeyEntry]) -> None:
        """Make ``entries`` the whole set of valid keys."""
        by_hash: dict[str, KeyEntry] = {}
        hash_of: dict[str, str] = {}
        for entry in entries:
            by_hash[entry.secret_hash.lower()] = entry
            hash_of[entry.key_id] = entry.secret_hash.lower()
        # Swap whole maps so a lookup never sees a half-built ring.
        self._by_hash, self._hash_of = by_hash, hash_of

    def add(self, entry: KeyEntry) -> None:
        """Add a key, or replace the key with the same ``key_id``."""
        self.remove(entry.key_id)
        digest = entry.secret_hash.lower()
        self._by_hash[digest] = entry
        self._hash_of[entry.key_id] = digest

    def remove(self, key_id: str) -> bool:
        """Forget a key; False when no key has that id."""
        digest = self._hash_of.pop(key_id, None)
        if digest is None:
            return False
        self._by_hash.pop(digest, None)
        return True

    def lookup(self, secret: str | bytes) -> KeyEntry | None:
        """The key whose secret this is, or None."""
        if not secret:
            return None
        raw = secret.encode() if isinstance(secret, str) else secret
        return self._by_hash.get(hashlib.sha256(raw).hexdigest())

    def get(self, key_id: str) -> KeyEntry | None:
        digest = self._hash_of.get(key_id)
        return None if digest is None else self._by_hash.get(digest)

    def __len__(self) -> int:
        return len(self._by_hash)

    def __iter__(self) -> Iterator[KeyEntry]:
        return iter(list(self._by_hash.values()))
