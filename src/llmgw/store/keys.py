"""Client API keys: created with a secret shown once, kept only as the secret's sha256.

A secret looks like ``sk-llmgw-`` followed by 40 URL-safe characters. The
store keeps its sha256 (to check it) and its first 8 characters after the
``sk-llmgw-`` (to tell keys apart in listings); the secret itself is never
written anywhere. The gateway checks requests against an in-memory ring built
from :meth:`Keys.active`, never against the database.
"""

from __future__ import annotations

import builtins
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from llmgw.core.tenancy import CLUSTER, Owner, OwnerKind
from llmgw.errors import Conflict, NotFound, ValidationFailed
from llmgw.store.tables import ApiKeyRow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from llmgw.store.access import StoreAccess

SECRET_PREFIX = "sk-llmgw-"
"""What every llmgw secret starts with."""

SECRET_RANDOM_BYTES = 30
"""Random bytes in a secret: 240 bits, 40 URL-safe characters."""

SHOWN_PREFIX_CHARS = 8
"""Characters of a secret, after ``sk-llmgw-``, kept in clear to tell keys apart."""


def hash_secret(secret: str) -> str:
    """The sha256 (hex) of a whole secret, as the store keeps it."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_secret() -> str:
    """A fresh secret: ``sk-llmgw-`` and 40 URL-safe random characters."""
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_RANDOM_BYTES)


def shown_prefix(secret: str) -> str:
    """The part of a secret that listings show."""
    return secret.removeprefix(SECRET_PREFIX)[:SHOWN_PREFIX_CHARS]


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """An API key as stored: everything but its secret."""

    id: str
    """A short random id, like ``key_ab12cd34``."""
    name: str
    prefix: str
    """The secret's first 8 characters after ``sk-llmgw-``."""
    secret_hash: str
    """The sha256 (hex) of the whole secret."""
    owner: str
    """A label: who uses the key."""
    created_at: datetime
    revoked_at: datetime | None
    place: Owner = CLUSTER
    """Where the key sits: a project, a user, or the cluster (nowhere: public models only)."""
    collections: tuple[str, ...] = ()
    """Knowledge collections its chat and Responses requests search when they name none."""

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class Keys:
    """API keys: create, list, revoke, and the active ones for the key ring."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def create(
        self, name: str, owner: str = "", place: Owner = CLUSTER, collections: Sequence[str] = ()
    ) -> tuple[KeyRecord, str]:
        """Create a key at ``place`` (a project or a user), searching ``collections`` by default;
        returns it and its secret, which cannot be read again.

        :class:`Conflict` when an active key already has that name.
        """
        if not name.strip():
            raise ValidationFailed([("name", "must not be empty")], hint="name the key after who uses it")
        if place.kind not in (OwnerKind.CLUSTER, OwnerKind.PROJECT, OwnerKind.USER):
            raise ValidationFailed(
                [("place", f"a key sits in a project or with a user, not at {place}")],
                hint="create the key with a project (project:ORG/TEAM/PROJECT) or a user (user:NAME)",
            )
        secret = new_secret()
        row = ApiKeyRow(
            id=f"key_{secrets.token_hex(4)}",
            name=name,
            prefix=shown_prefix(secret),
            secret_hash=hash_secret(secret),
            owner=owner,
            created_at=self._store.now(),
            revoked_at=None,
            place_kind=place.kind.value,
            place_path=place.path,
            collections=list(dict.fromkeys(collections)),
        )
        async with self._store.session() as session:
            taken = await session.scalar(
                select(ApiKeyRow.id).where(ApiKeyRow.name == name, ApiKeyRow.revoked_at.is_(None))
            )
            if taken is not None:
                raise _name_taken(name)
            session.add(row)
            try:
                await session.flush()
            except IntegrityError:
                raise _name_taken(name) from None
            return _record(row), secret

    async def find(self, id_or_name: str) -> KeyRecord:
        """The key with that id, or the active key with that name; :class:`NotFound` when none."""
        async with self._store.session() as session:
            row = await _find(session, id_or_name)
            return _record(row)

    async def revoke(self, id_or_name: str) -> KeyRecord:
        """Revoke the key with that id, or the active key with that name.

        Revoking a key already revoked (by id) changes nothing; :class:`NotFound`
        when no key matches.
        """
        async with self._store.session() as session:
            row = await _find(session, id_or_name)
            if row.revoked_at is None:
                row.revoked_at = self._store.now()
                await session.flush()
            return _record(row)

    async def active(self) -> builtins.list[KeyRecord]:
        """Every key not revoked, with its secret's hash: what the gateway's key ring holds."""
        return await self.list(include_revoked=False)

    async def list(self, include_revoked: bool = False) -> builtins.list[KeyRecord]:
        """Keys, oldest first; revoked ones only when ``include_revoked``."""
        query = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
        if not include_revoked:
            query = query.where(ApiKeyRow.revoked_at.is_(None))
        async with self._store.session() as session:
            return [_record(row) for row in await session.scalars(query)]


async def _find(session: AsyncSession, id_or_name: str) -> ApiKeyRow:
    row = await session.get(ApiKeyRow, id_or_name)
    if row is None:
        row = await session.scalar(
            select(ApiKeyRow).where(ApiKeyRow.name == id_or_name, ApiKeyRow.revoked_at.is_(None))
        )
    if row is None:
        raise NotFound(
            f"no active API key has the id or name {id_or_name!r}",
            hint="'llmgw ctl key list' lists the keys",
        )
    return row


def _record(row: ApiKeyRow) -> KeyRecord:
    return KeyRecord(
        id=row.id,
        name=row.name,
        prefix=row.prefix,
        secret_hash=row.secret_hash,
        owner=row.owner,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
        place=_place(row.place_kind, row.place_path),
        collections=tuple(row.collections or ()),
    )


def _place(kind: str, path: str) -> Owner:
    try:
        return Owner(OwnerKind(kind), path)
    except ValueError:
        return CLUSTER  # written by a newer llmgw: seen as nowhere, public models only


def _name_taken(name: str) -> Conflict:
    return Conflict(
        f"an active API key named {name!r} already exists",
        hint="revoke it first or choose another name",
    )
