"""The catalog: the models an operator has defined, by name, as stored definitions.

The store keeps a definition as the plain dict it was given; checking it is
:mod:`llmgw.core.catalog`'s job, before it gets here. The definition's
``owner`` is also kept in columns of its own (``owner_kind``, ``owner_path``)
to find what an owner owns. A provider model's key (``provider.key``) is
stored sealed when the store has the cluster's key (:mod:`llmgw.store.secretbox`)
and opened as the definition is read.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from llmgw.core.tenancy import CLUSTER, Owner, OwnerKind
from llmgw.errors import Conflict, NotFound
from llmgw.store.secretbox import SecretBox, open_plain
from llmgw.store.tables import ModelRow, rowcount
from llmgw.store.upserting import upsert

if TYPE_CHECKING:
    from llmgw.store.access import StoreAccess


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """A model of the catalog as stored."""

    name: str
    definition: dict[str, Any]
    """The model's definition, as given to :meth:`Catalog.add` or :meth:`Catalog.put`."""
    created_at: datetime
    updated_at: datetime
    owner: Owner = CLUSTER
    """Who owns the model (the definition's ``owner``)."""


def owner_of(definition: dict[str, Any]) -> Owner:
    """The owner a definition names; the cluster when it names none (checking it is the catalog's job)."""
    try:
        return Owner.parse(str(definition.get("owner") or ""))
    except ValueError:
        return CLUSTER


class Catalog:
    """Models by name: add, replace, read, list and remove."""

    def __init__(self, store: StoreAccess, secrets: SecretBox | None = None) -> None:
        self._store = store
        self._secrets = secrets
        """Seals the provider keys written and opens those read (None: kept as they are)."""

    def _sealed(self, name: str, definition: dict[str, Any]) -> dict[str, Any]:
        """``definition`` as stored: its provider key sealed for the model's row."""
        section = definition.get("provider")
        if self._secrets is None or not isinstance(section, dict) or not section.get("key"):
            return dict(definition)
        key = self._secrets.seal(str(section["key"]), _key_row(name))
        return {**definition, "provider": {**section, "key": key}}

    def _record(self, row: Any) -> ModelRecord:
        record = _record(row)
        section = record.definition.get("provider")
        if not isinstance(section, dict) or not section.get("key"):
            return record
        stored, at = str(section["key"]), _key_row(record.name)
        key = self._secrets.open(stored, at) if self._secrets is not None else open_plain(stored, at)
        definition = {**record.definition, "provider": {**section, "key": key}}
        return ModelRecord(record.name, definition, record.created_at, record.updated_at, record.owner)

    async def add(self, name: str, definition: dict[str, Any]) -> ModelRecord:
        """Add a new model; :class:`Conflict` when one of that name exists."""
        now = self._store.now()
        owner = owner_of(definition)
        row = ModelRow(
            name=name,
            definition=self._sealed(name, definition),
            created_at=now,
            updated_at=now,
            owner_kind=owner.kind.value,
            owner_path=owner.path,
        )
        async with self._store.session() as session:
            if await session.get(ModelRow, name) is not None:
                raise _exists(name)
            session.add(row)
            try:
                await session.flush()
            except IntegrityError:
                raise _exists(name) from None
            return self._record(row)

    async def put(self, name: str, definition: dict[str, Any]) -> ModelRecord:
        """Add the model, or replace the definition of the one of that name (keeping its ``created_at``)."""
        now = self._store.now()
        async with self._store.session() as session:
            owner = owner_of(definition)
            values = {
                "name": name,
                "definition": self._sealed(name, definition),
                "created_at": now,
                "updated_at": now,
                "owner_kind": owner.kind.value,
                "owner_path": owner.path,
            }
            update = ("definition", "updated_at", "owner_kind", "owner_path")
            row = await upsert(session, ModelRow, values, key="name", update=update)
            return self._record(row)

    async def get(self, name: str) -> ModelRecord:
        """The model called ``name``; :class:`NotFound` when there is none."""
        async with self._store.session() as session:
            row = await session.get(ModelRow, name)
            if row is None:
                raise _missing(name)
            return self._record(row)

    async def remove(self, name: str) -> None:
        """Remove the model and, with it, its replicas; :class:`NotFound` when there is none."""
        async with self._store.session() as session:
            result = await session.execute(delete(ModelRow).where(ModelRow.name == name))
            if not rowcount(result):
                raise _missing(name)

    async def list(self) -> builtins.list[ModelRecord]:
        """Every model, by name."""
        async with self._store.session() as session:  # columns, not ORM objects: read every reconcile pass
            rows = await session.execute(select(*_COLUMNS).order_by(ModelRow.name))
            return [self._record(row) for row in rows]


_COLUMNS = (ModelRow.name, ModelRow.definition, ModelRow.created_at, ModelRow.updated_at, ModelRow.owner_kind,
            ModelRow.owner_path)  # fmt: skip


def _record(row: Any) -> ModelRecord:  # a ModelRow, or a row of _COLUMNS
    try:
        owner = Owner(OwnerKind(row.owner_kind), row.owner_path)
    except ValueError:
        owner = CLUSTER
    return ModelRecord(
        name=row.name,
        definition=row.definition,
        created_at=row.created_at,
        updated_at=row.updated_at,
        owner=owner,
    )


def _key_row(name: str) -> str:
    """What a model's sealed provider key is bound to: its table, field and name."""
    return f"models.provider_key:{name}"


def _exists(name: str) -> Conflict:
    return Conflict(f"model {name!r} already exists", hint="remove it first or choose another name")


def _missing(name: str) -> NotFound:
    return NotFound(f"model {name!r} is not in the catalog", hint="llmgw ctl models lists the catalog")
