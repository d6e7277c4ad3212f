"""Organizations, teams and projects: the tree models, adapters and keys are owned in.

An organization holds teams; a team holds projects (``org/team/project``
paths, :class:`llmgw.core.tenancy.Owner`). Removing one that still owns a
model or holds an active key is refused (remove or move those first);
otherwise it goes with everything below it and every role bound there.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, and_, delete, func, or_, select

from llmgw.core.tenancy import Owner, OwnerKind, check_name
from llmgw.errors import Conflict, NotFound, ValidationFailed
from llmgw.store.tables import ApiKeyRow, ModelRow, OrgRow, ProjectRow, RoleBindingRow, TeamRow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from llmgw.store.access import StoreAccess

ROWS: dict[OwnerKind, type[OrgRow] | type[TeamRow] | type[ProjectRow]] = {
    OwnerKind.ORG: OrgRow,
    OwnerKind.TEAM: TeamRow,
    OwnerKind.PROJECT: ProjectRow,
}
LIST_HINT = {
    OwnerKind.ORG: "'llmgw ctl org list' lists the organizations",
    OwnerKind.TEAM: "'llmgw ctl team list' lists the teams",
    OwnerKind.PROJECT: "'llmgw ctl project list' lists the projects",
}


@dataclass(frozen=True, slots=True)
class Unit:
    """An organization, team or project as stored."""

    owner: Owner
    created_at: datetime

    @property
    def path(self) -> str:
        return self.owner.path


def _checked(kind: OwnerKind, path: str) -> Owner:
    try:
        return Owner(kind, path)
    except ValueError as error:
        raise ValidationFailed([("name", str(error))], "fix the name and try again") from None


class Tenants:
    """Create, list and remove organizations, teams and projects."""

    def __init__(self, store: StoreAccess) -> None:
        self._store = store

    async def create(self, kind: OwnerKind, path: str) -> Unit:
        """Create an org (``acme``), team (``acme/ml``) or project (``acme/ml/chat``) under an existing
        parent; :class:`Conflict` when it exists, :class:`NotFound` when its parent does not."""
        owner = _checked(kind, path)
        check_name(path.rsplit("/", 1)[-1])
        now = self._store.now()
        async with self._store.session() as session:
            parent = owner.parent()
            if parent is not None and not parent.public and not await _has(session, parent):
                raise NotFound(f"{parent} does not exist", f"create it first; {LIST_HINT[parent.kind]}")
            if await _has(session, owner):
                raise Conflict(f"{owner} already exists", "choose another name")
            if kind is OwnerKind.ORG:
                session.add(OrgRow(path=path, created_at=now))
            elif kind is OwnerKind.TEAM:
                session.add(TeamRow(path=path, org=owner.org, created_at=now))
            else:
                session.add(ProjectRow(path=path, team=path.rsplit("/", 1)[0], created_at=now))
            await session.flush()
            return Unit(owner, now)

    async def exists(self, owner: Owner) -> bool:
        """Whether ``owner`` names something stored (the cluster and users are not kept here)."""
        if owner.kind not in ROWS:
            return True
        async with self._store.session() as session:
            return await _has(session, owner)

    async def list(self, kind: OwnerKind, within: str = "") -> builtins.list[Unit]:
        """Every org, team or project (by path), only those under ``within`` (a path) when given."""
        row = ROWS[kind]
        column = row.path
        query = select(column, row.created_at).order_by(column)
        if within:
            query = query.where(or_(column == within, column.startswith(within + "/", autoescape=True)))
        async with self._store.session() as session:
            return [Unit(Owner(kind, path), at) for path, at in (await session.execute(query)).all()]

    async def remove(self, kind: OwnerKind, path: str) -> None:
        """Remove it, what is below it and the roles bound there; :class:`Conflict` while a model is
        owned or an active key sits at or below it."""
        owner = _checked(kind, path)
        async with self._store.session() as session:
            if not await _has(session, owner):
                raise NotFound(f"{owner} does not exist", LIST_HINT[kind])
            models = await session.scalar(
                select(func.count())
                .select_from(ModelRow)
                .where(at_or_below(owner, ModelRow.owner_kind, ModelRow.owner_path))
            )
            keys = await session.scalar(
                select(func.count())
                .select_from(ApiKeyRow)
                .where(
                    ApiKeyRow.revoked_at.is_(None),
                    at_or_below(owner, ApiKeyRow.place_kind, ApiKeyRow.place_path),
                )
            )
            if models or keys:
                raise Conflict(
                    f"{owner} still owns {models} model(s) and holds {keys} active key(s)",
                    "remove those models and revoke those keys first",
                )
            await session.execute(
                delete(RoleBindingRow).where(
                    at_or_below(owner, RoleBindingRow.scope_kind, RoleBindingRow.scope_path)
                )
            )
            row = ROWS[kind]
            await session.execute(delete(row).where(row.path == path))


BELOW = {
    OwnerKind.ORG: (OwnerKind.TEAM.value, OwnerKind.PROJECT.value),
    OwnerKind.TEAM: (OwnerKind.PROJECT.value,),
    OwnerKind.PROJECT: (),
}
"""The kinds of owner under each of the tree's kinds."""


def at_or_below(owner: Owner, kind_column: Any, path_column: Any) -> ColumnElement[bool]:
    """A filter on a (kind, path) column pair: ``owner`` itself or anything in its subtree."""
    return or_(
        and_(kind_column == owner.kind.value, path_column == owner.path),
        and_(kind_column.in_(BELOW[owner.kind]), path_column.startswith(owner.path + "/", autoescape=True)),
    )


async def _has(session: AsyncSession, owner: Owner) -> bool:
    row = ROWS[owner.kind]
    return await session.get(row, owner.path) is not None
