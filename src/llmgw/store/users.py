"""Users and their role bindings: a role at the cluster, an organization or a team.

A user belongs to the organizations and teams a role is bound at (that is
what membership is); one role per user and scope, a new one replacing it.
The control plane reads every binding at once (:meth:`Users.bindings`) to
keep its callers and the gateway's key places in memory.
"""

from __future__ import annotations

import builtins
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from llmgw.core.tenancy import Binding, Owner, OwnerKind, Role, check_name
from llmgw.errors import Conflict, NotFound, ValidationFailed
from llmgw.store.tables import RoleBindingRow, UserRow, rowcount

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess

USERS_HINT = "'llmgw ctl user list' lists the users"


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A user as stored, with the roles bound to them."""

    name: str
    created_at: datetime
    bindings: tuple[Binding, ...] = ()


class Users:
    """Create, list and remove users; bind and unbind their roles."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def create(self, name: str) -> UserRecord:
        """A new user with no role; :class:`Conflict` when one of that name exists."""
        try:
            check_name(name, "user name")
        except ValueError as error:
            raise ValidationFailed([("name", str(error))], "choose another name") from None
        now = self._store.now()
        async with self._store.session() as session:
            if await session.get(UserRow, name) is not None:
                raise Conflict(f"user {name!r} already exists", "choose another name")
            session.add(UserRow(name=name, created_at=now))
            await session.flush()
            return UserRecord(name, now)

    async def get(self, name: str) -> UserRecord:
        """The user called ``name`` with their bindings; :class:`NotFound` when there is none."""
        async with self._store.session() as session:
            row = await session.get(UserRow, name)
            if row is None:
                raise NotFound(f"no user is called {name!r}", USERS_HINT)
        return UserRecord(row.name, row.created_at, tuple((await self.bindings()).get(name, ())))

    async def exists(self, name: str) -> bool:
        async with self._store.session() as session:
            return await session.get(UserRow, name) is not None

    async def list(self) -> builtins.list[UserRecord]:
        """Every user, by name, with their bindings."""
        bindings = await self.bindings()
        async with self._store.session() as session:
            rows = await session.scalars(select(UserRow).order_by(UserRow.name))
            return [UserRecord(r.name, r.created_at, tuple(bindings.get(r.name, ()))) for r in rows]

    async def remove(self, name: str) -> None:
        """Remove the user, their bindings and their tokens."""
        async with self._store.session() as session:
            result = await session.execute(delete(UserRow).where(UserRow.name == name))
            if not rowcount(result):
                raise NotFound(f"no user is called {name!r}", USERS_HINT)

    async def bind(self, name: str, binding: Binding) -> None:
        """Give ``name`` ``binding.role`` at ``binding.scope`` (replacing the role held there)."""
        async with self._store.session() as session:
            if await session.get(UserRow, name) is None:
                raise NotFound(f"no user is called {name!r}", USERS_HINT)
            row = await session.scalar(
                select(RoleBindingRow).where(
                    RoleBindingRow.user_name == name,
                    RoleBindingRow.scope_kind == binding.scope.kind.value,
                    RoleBindingRow.scope_path == binding.scope.path,
                )
            )
            if row is None:
                row = RoleBindingRow(
                    user_name=name,
                    scope_kind=binding.scope.kind.value,
                    scope_path=binding.scope.path,
                    created_at=self._store.now(),
                )
                session.add(row)
            row.role = binding.role.label
            try:
                await session.flush()
            except IntegrityError:
                raise Conflict(
                    f"user {name!r} was given a role at {binding.scope or 'the cluster'} at the same time",
                    "look at 'llmgw ctl user list' and try again",
                ) from None

    async def unbind(self, name: str, scope: Owner) -> None:
        """Take away the role ``name`` holds at ``scope``; :class:`NotFound` when none is held there."""
        async with self._store.session() as session:
            result = await session.execute(
                delete(RoleBindingRow).where(
                    RoleBindingRow.user_name == name,
                    RoleBindingRow.scope_kind == scope.kind.value,
                    RoleBindingRow.scope_path == scope.path,
                )
            )
            if not rowcount(result):
                raise NotFound(
                    f"user {name!r} holds no role at {scope or 'the cluster'}",
                    f"'llmgw ctl user list' shows {name}'s roles",
                )

    async def bindings(self) -> dict[str, builtins.list[Binding]]:
        """Every user's bindings (users without any are absent)."""
        query = select(RoleBindingRow).order_by(RoleBindingRow.user_name, RoleBindingRow.id)
        out: dict[str, builtins.list[Binding]] = defaultdict(builtins.list)
        async with self._store.session() as session:
            for row in await session.scalars(query):
                out[row.user_name].append(
                    Binding(Role.parse(row.role), Owner(OwnerKind(row.scope_kind), row.scope_path))
                )
        return dict(out)
