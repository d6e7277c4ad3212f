"""What a request's strings must fit into: the store's sized text columns, read from the tables.

A string that lands in a ``String(n)`` column is refused by the request's model
(400, naming the field) when it is longer than the column or holds a NUL
character: PostgreSQL refuses both (an error that would otherwise answer 500),
SQLite keeps them silently. The sizes come from :mod:`llmgw.store.tables`, so a
migration that widens a column widens what the API accepts.

Text kept in JSON columns (settings' values, audit details) has no size, but
must be encodable as UTF-8: :func:`unicode_problem` finds a lone surrogate
(``"\\ud800"`` in a JSON body), which every answer that shows it back would
fail to encode.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.orm import InstrumentedAttribute

from llmgw.errors import ValidationFailed
from llmgw.store.tables import ApiKeyRow, AuditRow, BlobRow, ModelRow, SettingRow


def size_of(column: InstrumentedAttribute[str]) -> int:
    """The characters a ``String(n)`` column holds."""
    kind = column.expression.type
    if not isinstance(kind, String) or kind.length is None:
        raise TypeError(f"{column} is not a sized text column")
    return kind.length


KEY_NAME = size_of(ApiKeyRow.name)
KEY_OWNER = size_of(ApiKeyRow.owner)
KEY_PLACE = size_of(ApiKeyRow.place_path)
MODEL_NAME = size_of(ModelRow.name)
BLOB_FILENAME = size_of(BlobRow.filename)
SETTING_KEY = size_of(SettingRow.key)
AUDIT_TARGET = size_of(AuditRow.target)


def text_problem(value: str) -> str:
    """Why ``value`` cannot be kept in a text column (empty: it can)."""
    if "\x00" in value:
        return "holds a NUL character (\\u0000), which the store cannot keep; remove it"
    return unicode_problem(value)


def keepable(value: str) -> str:
    """A pydantic validator: ``value`` unchanged, or :class:`ValueError` saying why no column keeps it."""
    problem = text_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def checked_text(field: str, value: str) -> str:
    """``value`` (a path or query parameter) unchanged, or :class:`ValidationFailed` naming ``field``."""
    problem = text_problem(value)
    if problem:
        raise ValidationFailed([(field, problem)], f"fix {field} and try again")
    return value


def unicode_only(value: Any) -> Any:
    """A pydantic validator: a JSON value unchanged, or :class:`ValueError` when it is not valid Unicode."""
    problem = unicode_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def unicode_problem(value: Any) -> str:
    """Why a JSON value (its strings and keys, at any depth) is not valid Unicode (empty: it is)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "holds a lone surrogate (such as \\ud800), which is not text; send valid Unicode"
    return ""
