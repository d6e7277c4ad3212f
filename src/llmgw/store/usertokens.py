"""Users' tokens for ``/api`` and ``llmgw ctl``: created with a secret shown once, kept as its sha256.

A token belongs to one user and acts with that user's roles. It may expire
(``expires_at``) and may be revoked; the control plane keeps the hashes of
the live ones in memory (:meth:`UserTokens.live`) and checks each ``/api``
request against them, never against the database.
"""

from __future__ import annotations

import builtins
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import or_, select

from llmgw.errors import NotFound, ValidationFailed
from llmgw.store.keys import hash_secret
from llmgw.store.tables import UserRow, UserTokenRow

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess

TOKEN_PREFIX = "llmgw-ut-"
"""What every user token starts with (an API key starts with ``sk-llmgw-``)."""

SHOWN_CHARS = 8


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A user's token as stored: everything but its secret."""

    id: str
    user: str
    name: str
    prefix: str
    """The secret's first 8 characters after ``llmgw-ut-``, to tell tokens apart."""
    secret_hash: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    def live(self, now: datetime) -> bool:
        """Neither revoked nor expired at ``now``."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)


class UserTokens:
    """Create, list and revoke users' tokens, and read the live ones for the control plane's memory."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def create(
        self, user: str, name: str, expires_at: datetime | None = None
    ) -> tuple[TokenRecord, str]:
        """A new token of ``user``; returns it and its secret, which cannot be read again."""
        if not name.strip():
            raise ValidationFailed([("name", "must not be empty")], "name the token after where it is used")
        now = self._store.now()
        if expires_at is not None and expires_at <= now:
            raise ValidationFailed([("expires_at", "is not in the future")], "give a time to come, or none")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(30)
        row = UserTokenRow(
            id=f"tok_{secrets.token_hex(4)}",
            user_name=user,
            name=name,
            prefix=secret.removeprefix(TOKEN_PREFIX)[:SHOWN_CHARS],
            secret_hash=hash_secret(secret),
            created_at=now,
            expires_at=expires_at,
            revoked_at=None,
        )
        async with self._store.session() as session:
            if await session.get(UserRow, user) is None:
                raise NotFound(f"no user is called {user!r}", "'llmgw ctl user list' lists the users")
            session.add(row)
            await session.flush()
            return _record(row), secret

    async def get(self, token_id: str) -> TokenRecord:
        async with self._store.session() as session:
            row = await session.get(UserTokenRow, token_id)
            if row is None:
                raise _missing(token_id)
            return _record(row)

    async def revoke(self, token_id: str) -> TokenRecord:
        """Revoke the token with that id (again: no change); :class:`NotFound` when there is none."""
        async with self._store.session() as session:
            row = await session.get(UserTokenRow, token_id)
            if row is None:
                raise _missing(token_id)
            if row.revoked_at is None:
                row.revoked_at = self._store.now()
                await session.flush()
            return _record(row)

    async def list(self, user: str | None = None) -> builtins.list[TokenRecord]:
        """Tokens, oldest first (only ``user``'s when given), revoked and expired ones included."""
        query = select(UserTokenRow).order_by(UserTokenRow.created_at, UserTokenRow.id)
        if user is not None:
            query = query.where(UserTokenRow.user_name == user)
        async with self._store.session() as session:
            return [_record(row) for row in await session.scalars(query)]

    async def live(self) -> builtins.list[TokenRecord]:
        """Tokens neither revoked nor expired now: what the control plane accepts."""
        now = self._store.now()
        query = select(UserTokenRow).where(
            UserTokenRow.revoked_at.is_(None),
            or_(UserTokenRow.expires_at.is_(None), UserTokenRow.expires_at > now),
        )
        async with self._store.session() as session:
            return [_record(row) for row in await session.scalars(query)]


def _record(row: UserTokenRow) -> TokenRecord:
    return TokenRecord(
        id=row.id,
        user=row.user_name,
        name=row.name,
        prefix=row.prefix,
        secret_hash=row.secret_hash,
        created_at=row.created_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )


def _missing(token_id: str) -> NotFound:
    return NotFound(
        f"no token has the id {token_id!r}", "'llmgw ctl user token list USER' lists a user's tokens"
    )
