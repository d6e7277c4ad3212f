"""What a request's strings must fit into: the store's sized text columns.

A string that lands in a ``String(n)`` column is refused by the request's model
(400, naming the field) when it is longer than the column or holds a NUL
character: PostgreSQL refuses both (an error that would otherwise answer 500),
SQLite keeps them silently. The sizes are those of :mod:`llmgw.store.tables`,
stated here so that a client reads them without loading the store; a test
(``tests/adminapi/test_textfields.py``) reads them from the tables, so a
migration that widens a column fails it until the size here follows.

Text kept in JSON columns (settings' values, audit details) has no size, but
must be encodable as UTF-8: :func:`unicode_problem` finds a lone surrogate
(``"\\ud800"`` in a JSON body), which every answer that shows it back would
fail to encode.
"""

from __future__ import annotations

from typing import Any

from llmgw.errors import ValidationFailed

KEY_NAME = 128
"""``api_keys.name``."""
KEY_OWNER = 128
"""``api_keys.owner``."""
KEY_PLACE = 200
"""``api_keys.place_path``."""
MODEL_NAME = 128
"""``models.name``."""
BLOB_FILENAME = 512
"""``blobs.filename``."""
SETTING_KEY = 256
"""``settings.key``."""
AUDIT_TARGET = 512
"""``audit.target``."""


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
